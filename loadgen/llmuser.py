"""loadgen's Locust user: streams the scenario's completions or chat requests and reports
TTFT, TPOT, ITL and E2E latency as Locust entries; merges LLM metrics and records on the master.

Imported only inside a Locust process (Locust patches the standard library with gevent at
import; ``loadgen locust`` starts that process). It shares loadgen's pure parts -- scenario
loading, prompts and payloads, the SSE parser and stream accounting, records and metrics --
and never imports the asyncio client.

Clock: every process reads ``perf_counter_ns`` against its own base, taken together with the
wall clock at import. Records carry times on their process's clock; the master moves a
worker's records onto its own clock by the difference of the two wall-clock bases (exact on
one host; across hosts as good as their clock synchronisation).
"""

from __future__ import annotations

import csv
import itertools
import logging
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gevent
import orjson
from gevent.lock import Semaphore
from geventhttpclient import HTTPClient
from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError
from geventhttpclient.url import URL
from locust import LoadTestShape, User, constant, events, task
from locust import __version__ as locust_version
from locust.argument_parser import LocustArgumentParser
from locust.env import Environment
from locust.exception import StopUser
from locust.runners import MasterRunner, WorkerRunner
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

from loadgen.errors import LoadgenError
from loadgen.locustcore import (
    CSV_COLUMNS,
    ENTRIES,
    LLM,
    LiveStats,
    LocustPlan,
    RunDirSink,
    StepClock,
    plan_for,
    rebase,
    rows_csv,
)
from loadgen.matrix import Cell
from loadgen.metrics import itl_values, tpot
from loadgen.payload import ENDPOINTS, PreparedRequest, api_key, auth_headers
from loadgen.records import FailureClass, RequestRecord
from loadgen.rundir import base_provenance
from loadgen.scenario import Timeouts, load_scenario
from loadgen.stream import StreamState, error_snippet
from loadgen.workload import (
    TextCalibration,
    calibration_from,
    calibration_probes,
    needs_calibration,
    prepare_requests,
)

__all__ = ["LLMUser", "ScenarioSteps", "STATE", "LLMRequestFailed"]

log = logging.getLogger("loadgen")

BASE_NS = time.perf_counter_ns()
BASE_EPOCH_NS = time.time_ns()
# the master sees a worker's records this late (Locust's worker report interval)
REPORT_LAG_S = 3.0


class LLMRequestFailed(Exception):
    """A failed request as Locust shows it: ``<failure class>: <detail>``."""


def now_s() -> float:
    return (time.perf_counter_ns() - BASE_NS) / 1e9


@dataclass
class Workbench:
    """What the users of one process send: built once per (host, scenario) before the first request."""

    host: str
    path: str
    headers: dict[str, str]
    timeouts: Timeouts
    model: str
    pool: list[PreparedRequest]
    calibration: TextCalibration
    next_prompt: itertools.count[int] = field(default_factory=itertools.count)


class _State:
    """This process's share of the run: the plan, the workbench, and where records go."""

    def __init__(self) -> None:
        self.env: Environment | None = None
        self.source: str | None = None
        self.overrides: list[str] = []
        self.plan: LocustPlan | None = None
        self.bench: Workbench | None = None
        self._bench_lock = Semaphore()
        self.request_ids = itertools.count()
        self.pending: list[bytes] = []  # a worker's records not yet sent to the master
        self.live = LiveStats()
        self.steps = StepClock()
        self.sink: RunDirSink | None = None
        self.peak_users = 0
        self.used_shape = False
        self.model: str | None = None
        self.closed = False
        self.failed = False
        # set when Locust starts stopping the test: a user between two requests sends no more
        # (Locust kills waiting users, and its kill can land after the next request was sent)
        self.stopping = False

    # -- set-up ---------------------------------------------------------------------------------
    def load(self, source: str, overrides: list[str]) -> None:
        scenario = load_scenario(source, overrides)
        self.plan = plan_for(scenario, source)
        self.source, self.overrides = source, overrides
        self.bench = None

    def workbench(self, host: str) -> Workbench:
        """The request pool for ``host`` (model resolved, text calibrated), built by the first user."""
        with self._bench_lock:
            if self.bench is None or self.bench.host != host:
                assert self.plan is not None
                self.bench = _build_workbench(self.plan, host)
                self.model = self.bench.model
            return self.bench

    def give_up(self, message: str) -> None:
        """Nothing can be sent (no server, no model): say it once and end the test."""
        if self.failed:
            return
        self.failed = True
        log.error("error: %s", message)
        env = self.env
        if env is not None and env.runner is not None:
            env.process_exit_code = 2
            gevent.spawn(env.runner.quit)

    # -- records --------------------------------------------------------------------------------
    def take(self, record: RequestRecord) -> None:
        """A record of this process's users: kept for the master (worker) or counted here."""
        env = self.env
        if env is not None and isinstance(env.runner, WorkerRunner):
            self.pending.append(record.to_json())
            return
        self.count(replace(record, cell=self.steps.cell_of(record.sent_at)))

    def count(self, record: RequestRecord) -> None:
        if self.closed:
            return  # after the run directory was written (nothing is sent by then)
        self.live.add(record)
        if self.sink is not None:
            self.sink.add(record)
        if self.env is not None and self.env.runner is not None:
            self.peak_users = max(self.peak_users, self.env.runner.user_count)

    def merge(self, worker: int, data: dict[str, Any]) -> None:
        """The master: a worker's report -> its records on the master's clock."""
        shift = (data["base_epoch_ns"] - BASE_EPOCH_NS) / 1e9
        self.model = self.model or data.get("model")
        for line in data["records"]:
            record = rebase(line, shift, next(self.request_ids), worker)
            self.count(replace(record, cell=self.steps.cell_of(record.sent_at)))

    def rows(self, users: int | None = None) -> list[dict[str, Any]]:
        """The LLM table now; ``users`` defaults to the users running now."""
        runner = self.env.runner if self.env is not None else None
        lag = REPORT_LAG_S if isinstance(runner, MasterRunner) else 0.0
        if users is None:
            users = runner.user_count if runner is not None else 0
        return self.live.rows(now_s(), users, lag)


STATE = _State()


def _build_workbench(plan: LocustPlan, host: str) -> Workbench:
    target = plan.scenario.target
    base = host.rstrip("/")
    url = URL(base + ENDPOINTS[target.api])
    headers = {**auth_headers(target, api_key(target)), "Accept-Encoding": "identity"}
    t = target.timeouts
    http = _client(url, t)
    try:
        model = target.model
        if model == "auto":
            model = _resolve_model(http, URL(base + "/models"), headers)
        calibration = TextCalibration()
        if needs_calibration(plan.scenario):
            points = []
            for words, body in calibration_probes(plan.scenario, model):
                st = StreamState()
                _stream(http, url.request_uri, body, headers, t, st)
                points.append((words, st.prompt_tokens))
            calibration = calibration_from(points)
    finally:
        http.close()
    cell = Cell(0, plan.input_tokens, plan.output_tokens, None, None, plan.scenario)
    pool = prepare_requests(plan.scenario, cell, model, calibration)
    return Workbench(base, url.request_uri, headers, t, model, pool, calibration)


def _client(url: URL, t: Timeouts) -> HTTPClient:
    # one connection per user, kept alive: the asyncio client's model
    return HTTPClient.from_url(
        url, concurrency=1,
        connection_timeout=t.connect_s or 3600.0, network_timeout=t.between_tokens_s or 3600.0,
    )


def _resolve_model(http: HTTPClient, url: URL, headers: dict[str, str]) -> str:
    try:
        resp = http.get(url.request_uri, headers=headers)
        body = resp.read()
    except (OSError, HTTPConnectionClosed, HTTPParseError) as exc:
        raise LoadgenError(f"{url}: cannot reach the server ({exc}); check --host") from exc
    if resp.status_code >= 400:
        raise LoadgenError(f"{url}: HTTP {resp.status_code}; is --host the server's /v1 base URL?")
    try:
        ids = [m["id"] for m in orjson.loads(body)["data"]]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise LoadgenError(f"{url}: not an OpenAI /models answer; is --host the /v1 base URL?") from exc
    if not ids:
        raise LoadgenError(f"{url}: the server lists no model; set target.model in the scenario")
    return str(ids[0])


def _stream(
    http: HTTPClient, path: str, body: bytes, headers: dict[str, str], t: Timeouts, st: StreamState
) -> tuple[FailureClass | None, str | None]:
    """Send one streaming request and read it to the end into ``st``; never raises for a
    failed request. A ``gevent.GreenletExit`` (Locust stopping the user) propagates with
    ``st`` filled so far.
    """
    limits = [x for x in (t.first_token_s, t.total_s) if x is not None]
    timer = gevent.Timeout(min(limits)) if limits else None
    resp = None
    now = time.perf_counter_ns
    error: FailureClass | None = None
    detail: str | None = None
    if timer is not None:
        timer.start()
    try:
        st.sent_ns = now()
        resp = http.request("POST", path, body=body, headers=headers)
        st.status = resp.status_code
        if st.status >= 400:
            error, detail = "http_status", error_snippet(resp.read())
            st.done_ns = now()
            return error, detail
        readline = resp.readline
        while True:
            line = readline(b"\n")
            if not line:
                rest = resp.read()  # a last line the server did not end with LF
                if rest:
                    st.feed(rest, now())
                break
            had_token = bool(st.chunk_ns)
            if st.feed(line, now()) and st.outcome != (None, None):
                break  # a failure: stop reading (the connection is closed, not reused)
            if not had_token and st.chunk_ns and timer is not None:
                timer.cancel()  # the first token is in: only the total timeout applies now
                timer = None
                if t.total_s is not None:
                    timer = gevent.Timeout(max(t.total_s - (now() - st.sent_ns) / 1e9, 0.0))
                    timer.start()
        error, detail = st.end(now())
    except gevent.Timeout as exc:
        if exc is not timer:
            raise
        error, detail = "timeout", "first token" if not st.chunk_ns else "total"
    except TimeoutError as exc:  # the socket's connect or read timeout
        error = "timeout"
        detail = "connect or response headers" if resp is None else f"between tokens ({exc})"
    except (HTTPConnectionClosed, HTTPParseError, ConnectionResetError, BrokenPipeError) as exc:
        error = "reset" if st.status is None else "stream_cut"
        detail = str(exc) or type(exc).__name__
    except OSError as exc:  # refused, unreachable, name not resolved
        error = "connect" if st.status is None else "stream_cut"
        detail = str(exc) or type(exc).__name__
    finally:
        if timer is not None:
            timer.cancel()
        if resp is not None:
            resp.release()
    if st.done_ns is None and error is not None:
        st.done_ns = now()
    return error, detail


def report(env: Environment, record: RequestRecord, elapsed_ms: float) -> None:
    """The record as Locust request events: TTFT, TPOT, ITL (one per gap) and E2E."""
    if record.error == "cancelled":
        return  # the run stopped it; kept in records.jsonl, not a failure of the server
    fire = env.events.request.fire
    start = BASE_EPOCH_NS / 1e9 + (record.sent_at or 0.0)
    if not record.ok:
        exc = LLMRequestFailed(f"{record.error}: {(record.error_detail or '')[:160]}")
        fire(request_type=LLM, name="E2E", response_time=elapsed_ms, response_length=record.output_tokens,
             exception=exc, context={}, start_time=start)
        return
    sent = record.sent_at or 0.0
    if record.first_token_at is not None:
        fire(request_type=LLM, name="TTFT", response_time=(record.first_token_at - sent) * 1e3,
             response_length=record.prompt_tokens or record.input_tokens or 0, exception=None,
             context={}, start_time=start)
    t = tpot(record)
    if t is not None:
        fire(request_type=LLM, name="TPOT", response_time=t * 1e3, response_length=record.output_tokens,
             exception=None, context={}, start_time=start)
    for gap, n in zip(itl_values(record), record.chunk_tokens[1:], strict=True):
        fire(request_type=LLM, name="ITL", response_time=float(gap) * 1e3, response_length=n,
             exception=None, context={}, start_time=start)
    fire(request_type=LLM, name="E2E", response_time=elapsed_ms, response_length=record.output_tokens,
         exception=None, context={}, start_time=start)


class LLMUser(User):
    """One closed-loop stream: sends the scenario's next prompt as soon as the last one ends."""

    wait_time = constant(0)

    def on_start(self) -> None:
        self.bench: Workbench | None = None
        try:
            if self.host is None:
                raise LoadgenError("--host: give the server's base URL, e.g. --host http://127.0.0.1:8000/v1")
            self.bench = STATE.workbench(self.host)
        except LoadgenError as exc:
            STATE.give_up(str(exc))
            return  # the task stops this user (Locust logs a traceback for a StopUser raised here)
        self.http = _client(URL(self.bench.host + self.bench.path), self.bench.timeouts)
        # open the connection before the first measured request, so TTFT holds no TCP setup
        try:
            self.http.get(URL(self.bench.host + "/models").request_uri, headers=self.bench.headers).read()
        except (OSError, HTTPConnectionClosed, HTTPParseError):
            pass  # the first request records what is wrong

    def on_stop(self) -> None:
        if self.bench is not None:
            self.http.close()

    @task
    def stream(self) -> None:
        bench = self.bench
        if bench is None:
            raise StopUser()
        if STATE.stopping:
            return
        req = bench.pool[next(bench.next_prompt) % len(bench.pool)]
        request_id = next(STATE.request_ids)
        t = bench.timeouts
        st = StreamState(t.first_token_s, t.total_s)
        try:
            error, detail = _stream(self.http, bench.path, req.body, bench.headers, bench.timeouts, st)
        except gevent.GreenletExit:
            if st.sent_ns:
                STATE.take(st.record(req, request_id, st.sent_ns, BASE_NS, "cancelled", "run stopped"))
            raise
        record = st.record(req, request_id, st.sent_ns, BASE_NS, error, detail)
        end = st.done_ns or time.perf_counter_ns()
        report(self.environment, record, (end - st.sent_ns) / 1e6)
        STATE.take(record)


class ScenarioSteps(LoadTestShape):
    """The scenario's concurrency sweep as steps: each step holds that many users for
    ``load.duration_s`` seconds (``--step-time`` when the scenario gives none); each step
    is one cell of the run directory."""

    def __init__(self) -> None:
        super().__init__()
        self._step = -1

    def tick(self) -> tuple[int, float] | None:
        plan = STATE.plan
        if plan is None:
            return None
        step_s = plan.step_s or _option("step_time", 60.0)
        k = int(self.get_run_time() // step_s)
        if k >= len(plan.steps):
            return None
        if k != self._step:
            self._step = k
            STATE.used_shape = True
            STATE.steps.step_started(now_s())
            log.info("loadgen: step %d/%d, %d users", k + 1, len(plan.steps), plan.steps[k])
        users = plan.steps[k]
        return users, float(max(users, 1))


def _option(name: str, default: Any) -> Any:
    opts = STATE.env.parsed_options if STATE.env is not None else None
    value = getattr(opts, name, None) if opts is not None else None
    return default if value is None else value


# -- Locust events ------------------------------------------------------------------------------


@events.init_command_line_parser.add_listener
def _arguments(parser: LocustArgumentParser) -> None:
    parser.add_argument("--scenario", default=None, include_in_web_ui=False,
                       help="loadgen scenario file: workload, sampling, API, timeouts, concurrency steps")
    parser.add_argument("--set", dest="loadgen_set", action="append", default=None, include_in_web_ui=False,
                       help="override a scenario key: dotted.key=value (repeatable)")
    parser.add_argument("--loadgen-out", default=None, include_in_web_ui=False,
                       help="also write loadgen's run directory here (records.jsonl, summary.json)")
    parser.add_argument("--step-time", type=float, default=None, include_in_web_ui=False,
                       help="seconds per concurrency step of the ScenarioSteps shape (default: "
                       "the scenario's load.duration_s, else 60)")


@events.init.add_listener
def _init(environment: Environment, **_: Any) -> None:
    STATE.env = environment
    opts = environment.parsed_options
    source = getattr(opts, "scenario", None)
    if not isinstance(source, str):
        _fail("--scenario: give a loadgen scenario file, e.g. --scenario scenarios/chat.yaml")
        return
    try:
        STATE.load(source, list(getattr(opts, "loadgen_set", None) or []))
    except LoadgenError as exc:
        _fail(str(exc))
    if isinstance(environment.runner, WorkerRunner):
        return
    out = getattr(opts, "loadgen_out", None)
    if out:
        assert STATE.plan is not None
        provenance = base_provenance(STATE.plan.scenario) | {
            "client": "locust", "locust_version": locust_version, "base_url": environment.host,
            "clock_base_ns": BASE_NS, "clock_base_epoch_ns": BASE_EPOCH_NS,
            "clock": "perf_counter per process; workers' records moved onto the master's clock by wall-clock bases",
        }
        try:
            STATE.sink = RunDirSink(Path(out), STATE.plan, provenance)
        except LoadgenError as exc:
            _fail(str(exc))
    if environment.web_ui is not None:
        _extend_web_ui(environment)


def _fail(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(2)


@events.test_start.add_listener
def _test_start(environment: Environment, **_: Any) -> None:
    STATE.stopping = False
    opts = environment.parsed_options
    source = getattr(opts, "scenario", None)
    overrides = list(getattr(opts, "loadgen_set", None) or [])
    if source is not None and (source, overrides) != (STATE.source, STATE.overrides):
        STATE.load(source, overrides)  # a worker given the master's scenario


@events.test_stopping.add_listener
def _test_stopping(**_: Any) -> None:
    STATE.stopping = True


@events.report_to_master.add_listener
def _report_to_master(client_id: str, data: dict[str, Any]) -> None:
    data["loadgen"] = {"records": STATE.pending, "base_epoch_ns": BASE_EPOCH_NS, "model": STATE.model}
    STATE.pending = []


@events.worker_report.add_listener
def _worker_report(client_id: str, data: dict[str, Any]) -> None:
    env = STATE.env
    payload = data.get("loadgen")
    if payload is None or env is None or not isinstance(env.runner, MasterRunner):
        return
    STATE.merge(env.runner.get_worker_index(client_id) + 1, payload)


@events.reset_stats.add_listener
def _reset_stats(**_: Any) -> None:
    STATE.live.reset()


@events.quit.add_listener
def _quit(**_: Any) -> None:
    """The very end (users stopped, in-flight requests recorded as cancelled, workers' last
    reports in): LLM totals to the log, final CSVs, and the run directory's summary."""
    environment = STATE.env
    if environment is None or isinstance(environment.runner, WorkerRunner) or STATE.closed:
        return
    STATE.closed = True
    rows = STATE.rows(users=STATE.peak_users)  # the users are stopped by now: per user of the peak
    for row in rows:
        log.info(
            "loadgen LLM %-9s requests %d, failures %d (%s), output tokens %d, output tok/s %.1f, "
            "decode tok/s per stream %s", row["name"], row["requests"], row["failures"],
            row["failure_classes"], row["output_tokens"], row["output_tok_s"], row["stream_tok_s"],
        )
    opts = environment.parsed_options
    csv_prefix = getattr(opts, "csv_prefix", None)
    if csv_prefix:
        _final_csv(environment, csv_prefix)
        Path(f"{csv_prefix}_llm.csv").write_text(rows_csv(rows))
    if STATE.sink is not None and STATE.plan is not None:
        users = STATE.plan.steps if STATE.used_shape else (max(STATE.peak_users, 1),)
        server = {"backend": None, "base_url": environment.host, "launched": False, "client": "locust"}
        STATE.sink.provenance["model"] = STATE.model
        STATE.sink.provenance["workers"] = (
            environment.runner.worker_count if isinstance(environment.runner, MasterRunner) else 0
        )
        STATE.sink.close(users, interrupted=False, server=server)
        log.info("loadgen: run directory %s (loadgen report %s)", STATE.sink.run_dir, STATE.sink.run_dir)


def _final_csv(environment: Environment, prefix: str) -> None:
    """Locust's --csv files as of the end of the run.

    Locust rewrites them once a second from a background greenlet, so the requests that
    finish in the last second (those the stop timeout let complete) were missing from them.
    """
    writer = StatsCSV(environment, PERCENTILES_TO_REPORT)
    for suffix, write in (
        ("_stats.csv", writer.requests_csv),
        ("_failures.csv", writer.failures_csv),
        ("_exceptions.csv", writer.exceptions_csv),
    ):
        path = Path(prefix + suffix)
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w", newline="") as f:
            write(csv.writer(f))
        tmp.replace(path)


def _extend_web_ui(environment: Environment) -> None:
    """An "LLM" tab (tokens/s per worker and in total), /llm/stats as JSON and CSV."""
    from flask import Response, jsonify, request

    web_ui = environment.web_ui
    assert web_ui is not None
    assert web_ui.app is not None
    web_ui.template_args["extended_tabs"] = [{"title": "LLM", "key": "llm"}]
    web_ui.template_args["extended_tables"] = [
        {"key": "llm", "structure": [{"key": k, "title": title} for k, title in CSV_COLUMNS]}
    ]
    web_ui.template_args["extended_csv_files"] = [
        {"href": "./llm/stats/csv", "title": "Download LLM statistics CSV (tokens/s per worker and total)"}
    ]

    @web_ui.app.after_request
    def _add_llm_stats(response: Response) -> Response:
        if request.path.endswith("/stats/requests") and response.is_json:
            data = response.get_json()
            data["extended_stats"] = [{"key": "llm", "data": STATE.rows()}]
            response.set_data(orjson.dumps(data))
        return response

    @web_ui.app.route("/llm/stats")
    @web_ui.auth_required_if_enabled
    def _llm_stats() -> Any:
        return jsonify({"entries": list(ENTRIES), "rows": STATE.rows(), "users": environment.runner.user_count
                        if environment.runner is not None else 0})

    @web_ui.app.route("/llm/stats/csv")
    @web_ui.auth_required_if_enabled
    def _llm_stats_csv() -> Response:
        return Response(rows_csv(STATE.rows()), mimetype="text/csv",
                        headers={"Content-Disposition": "attachment;filename=llm_stats.csv"})

