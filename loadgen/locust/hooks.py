"""loadgen's Locust event listeners (registered on import): its command-line options, the
run directory on the master, records shipped from workers, the final CSVs, and the "LLM"
tab of the web UI.
"""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import gevent
import gevent.event
import orjson
from locust import __version__ as locust_version
from locust import events
from locust.argument_parser import LocustArgumentParser
from locust.env import Environment
from locust.rpc import Message
from locust.runners import MasterRunner, WorkerRunner
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

from loadgen.data import Unchecked
from loadgen.errors import LoadgenError
from loadgen.locust.health import monitor
from loadgen.locust.plan import RunDirSink
from loadgen.locust.state import BASE_EPOCH_NS, BASE_NS, DONE_MESSAGE, STATE, WorkerReport, log, now_s
from loadgen.locust.stats import ENTRIES, TAB_COLUMNS, report_section, rows_csv, tab_rows
from loadgen.locust.transport import QUITTING_FILE_ENV, STOP_FILE_ENV, clock_of
from loadgen.results.cellstatus import ServerInfo
from loadgen.results.provenance import Provenance
from loadgen.scenario.redact import redact_url

CHARTS_JS = Path(__file__).with_name("llm_tab.js")


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
    # a closed terminal (SIGHUP to the whole process group, Locust's too) ends Locust as SIGTERM
    # does, its stats and run directory written; by default it ended the process at once
    gevent.signal_handler(signal.SIGHUP, os.kill, os.getpid(), signal.SIGTERM)
    # Ctrl-C is raised in Locust's main greenlet, where its own stop path hears it
    gevent.signal_handler(signal.SIGINT, _interrupt_main)
    opts = environment.parsed_options
    source = getattr(opts, "scenario", None)
    if not isinstance(source, str):
        _fail("--scenario: give a loadgen scenario file, e.g. --scenario scenarios/chat.yaml")
        return
    try:
        STATE.load(source, list(getattr(opts, "loadgen_set", None) or []))
    except LoadgenError as exc:
        _fail(str(exc))
    if not isinstance(environment.runner, MasterRunner):  # a process that runs users: its self-check
        gevent.spawn(monitor, STATE.users_running, STATE.health)
    if isinstance(environment.runner, WorkerRunner):
        environment.runner.register_message(SHARE_MESSAGE, _share)
        # after the runner's own listener, so first of all (quitting's listeners run last first)
        environment.events.quitting.add_listener(_worker_quitting)
        return
    if isinstance(environment.runner, MasterRunner):
        environment.runner.register_message(DONE_MESSAGE, _worker_done)
        _quit_after_final_reports(environment.runner)
        gevent.spawn(_watch_workers, environment.runner)
    out = getattr(opts, "loadgen_out", None)
    if out:
        assert STATE.plan is not None
        try:  # the clock that times the answers' bytes (each worker's, from the same scenario)
            kernel, why_not = clock_of(STATE.plan, environment.host or "")
        except LoadgenError as exc:
            _fail(str(exc))
            return
        provenance = Provenance.new(
            STATE.plan.scenario, client="locust", locust_version=locust_version,
            base_url=environment.host and redact_url(environment.host),
            clock_base_ns=BASE_NS, clock_base_epoch_ns=BASE_EPOCH_NS,
            clock="perf_counter per process; workers' records moved onto the master's clock by wall-clock bases",
            client_clock={"clock": "kernel" if kernel else "loop", "why_not_kernel": why_not},
        )
        try:
            STATE.sink = RunDirSink(Path(out), STATE.plan, provenance)
        except LoadgenError as exc:
            _fail(str(exc))
    if environment.web_ui is not None:
        _extend_web_ui(environment)
    if getattr(opts, "html_file", None):
        _llm_figures_in_html_file()
    if environment.shape_class is not None:
        # Locust installs its SIGTERM handler only once a headless shape has ended: until then
        # a SIGTERM (loadgen's stop, `timeout`) would end the process before anything is written
        gevent.signal_handler(signal.SIGTERM, _stop_shape, environment)
    gevent.spawn(_sample_charts, environment)


def _llm_figures_in_html_file() -> None:
    """Locust's ``--html`` file with the LLM figures of the last test below Locust's own, as its
    Download Report has them: Locust writes the file at its end through ``get_html_report``,
    looked up in its main module when it writes."""
    import locust.main as locust_main

    made = getattr(locust_main, "get_html_report")  # noqa: B009 - not in the module's exports

    def with_llm_figures(*args: Any, **kwargs: Any) -> str:
        page = str(made(*args, **kwargs))
        end = page.rfind("</body>")
        if end < 0:
            return page
        return page[:end] + report_section(STATE.rows(users=STATE.peak_users or None)) + page[end:]

    setattr(locust_main, "get_html_report", with_llm_figures)  # noqa: B010


def _interrupt_main() -> None:
    """Ctrl-C: the KeyboardInterrupt Locust stops on, raised in its main greenlet. (Python raised
    it in whichever greenlet was running, often a user's mid-request, and gevent printed that
    greenlet's traceback before passing the interrupt on.)"""
    hub = gevent.get_hub()
    hub.loop.run_callback(hub.parent.throw, KeyboardInterrupt)


def _stop_shape(environment: Environment) -> None:
    """SIGTERM during a shape: stop it; Locust then shuts down its own way (run directory written)."""
    log.info("loadgen: SIGTERM: stopping the shape test")
    if environment.runner is not None:
        gevent.spawn(environment.runner.quit)


SHARE_MESSAGE = "loadgen-share"


def _share(environment: Environment, msg: Any, **_: Any) -> None:
    """A worker told its share of the test starting: (its index, the workers' count)."""
    start = msg.data.get("start_epoch_ns")
    STATE.new_share(int(msg.data["index"]), int(msg.data["count"]), int(msg.data["seed"]),
                    int(start) if start is not None else None)


def _worker_done(environment: Environment, msg: Any, **_: Any) -> None:
    """A worker's share of the dataset is all sent and answered."""
    what = msg.data.get("what")
    STATE.worker_done(int(msg.data["index"]), msg.data.get("entries"), bool(msg.data.get("sessions")),
                      str(what) if what else None)


def _fail(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(2)


@events.test_start.add_listener
def _test_start(environment: Environment, **_: Any) -> None:
    STATE.stopping = False
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        # each worker's share of a dataset, before its users spawn (messages arrive in order)
        workers = sorted((c for c in runner.clients.all if c.state != "missing"), key=lambda c: c.id)
        start = time.time_ns()  # the zero of a trace's or an open loop's schedule, on every worker
        for i, client in enumerate(workers):
            runner.send_message(SHARE_MESSAGE, {"index": i, "count": len(workers), "seed": STATE.seed,
                                                "start_epoch_ns": start}, client_id=client.id)
        STATE.workers_in_test, STATE.workers_done, STATE.exhausted_said = len(workers), set(), False
    if not isinstance(runner, WorkerRunner):
        STATE.test_started()
    if not isinstance(runner, (WorkerRunner, MasterRunner)):
        STATE.new_share(0, 1)  # one process sends the whole dataset, from its first entry again
    opts = environment.parsed_options
    source = getattr(opts, "scenario", None)
    overrides = list(getattr(opts, "loadgen_set", None) or [])
    if source is not None and (source, overrides) != (STATE.source, STATE.overrides):
        STATE.load(source, overrides)  # a worker given the master's scenario


def _stopped() -> bool:
    """Whether Locust was stopped (Ctrl-C here, a signal loadgen passed on) rather than the test
    ending its own way (its run time, the web UI's STOP)."""
    marker = os.environ.get(STOP_FILE_ENV)
    return marker is not None and Path(marker).exists()


@events.quitting.add_listener
def _quitting(environment: Environment, **_: Any) -> None:
    """Tell loadgen that Locust is quitting (its run time ended, or a stop it heard itself)."""
    if isinstance(environment.runner, WorkerRunner):
        return
    # Locust stops once: a further stop (loadgen's SIGTERM after its grace, the group's signal
    # reaching it late on a busy machine) arrived while the master waited for its worker processes
    # at exit, and Locust's handler called its shutdown again there, printing a traceback
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    path = os.environ.get(QUITTING_FILE_ENV)
    if path:
        with contextlib.suppress(OSError):
            Path(path).touch()


def _worker_quitting(environment: Environment, **_: Any) -> None:
    """A worker quitting on a stop it heard itself (the group's Ctrl-C, SIGTERM, a closed
    terminal): its users stopped and its last records reported before Locust tells the master it
    quit, after which the master takes no report of it. (Quitting on the master's word it has
    stopped and reported already; this sends an empty report.)"""
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        runner.stop()
        runner._send_stats()  # noqa: SLF001 - Locust's final report, as on the master's quit


@events.test_stopping.add_listener
def _test_stopping(**_: Any) -> None:
    STATE.stopping = True


@events.test_stop.add_listener
def _test_stop(environment: Environment, **_: Any) -> None:
    """A stop (the web UI's STOP included): the run directory gets its summary and report for
    what was measured so far, without waiting for Locust to exit."""
    if isinstance(environment.runner, WorkerRunner) or STATE.closed:
        return
    STATE.see_users()
    STATE.cells.close(now_s())
    if STATE.sink is None:
        return
    try:
        STATE.sink.snapshot(STATE.applied(), interrupted=False, server=_server(environment),
                            probes=tuple(STATE.probes), lost=STATE.workers_lost)
        log.info("loadgen: run directory %s updated (loadgen report %s)", STATE.sink.run_dir, STATE.sink.run_dir)
    except (LoadgenError, OSError) as exc:
        log.error("loadgen: could not write the run directory's summary: %s", exc)


def _server(environment: Environment) -> ServerInfo:
    return ServerInfo(base_url=environment.host and redact_url(environment.host), model=STATE.model,
                      quant=STATE.plan.scenario.target.quant if STATE.plan else None)


def _sample_charts(environment: Environment) -> None:
    """A point of the LLM tab's charts every 2 s while users run (the master's or one process's view)."""
    while True:
        gevent.sleep(2.0)
        runner = environment.runner
        if runner is not None and (runner.user_count > 0 or runner.state in ("spawning", "running")):
            STATE.see_users()
            STATE.sample()


@events.report_to_master.add_listener
def _report_to_master(client_id: str, data: Unchecked) -> None:
    # data: Locust's report, whose other keys are Locust's and its plugins'
    # no user runs: every request of this worker has its record in this report or an earlier one
    # (a worker told to stop and then to quit is back in its 'init' state, users stopped)
    runner = STATE.env.runner if STATE.env is not None else None
    final = runner is not None and runner.user_count == 0
    data["loadgen"] = WorkerReport(STATE.pending, BASE_EPOCH_NS, STATE.model, STATE.pending_samples,
                                   final, STATE.sent).to_dict()
    STATE.pending, STATE.pending_samples = [], []


@events.worker_report.add_listener
def _worker_report(client_id: str, data: Unchecked) -> None:
    env = STATE.env
    payload = data.get("loadgen")
    if payload is None or env is None or not isinstance(env.runner, MasterRunner):
        return
    report = WorkerReport.from_dict(payload)
    index = env.runner.get_worker_index(client_id) + 1
    STATE.last_report[index] = (now_s(), int(data.get("user_count") or 0))
    STATE.merge(index, report)
    if report.final and STATE.awaiting_final is not None:
        STATE.awaiting_final.discard(client_id)


# the longest a quitting master waits for each worker's final report
FINAL_REPORT_S = 15.0


def _quit_after_final_reports(runner: MasterRunner) -> None:
    """The master quits as Locust's does (its test stopped, a quit to each worker), then waits
    for each worker's report sent once its users stopped, at most ``FINAL_REPORT_S``, where
    Locust waits a fixed 0.5 s: a worker stopping hundreds of users on a busy machine took
    longer, and their records (the requests in flight at the stop, as cancelled, and the last
    answers) never reached the run directory, 386 of 875 requests once."""

    finished = gevent.event.Event()

    def quit_after_reports() -> None:
        if STATE.awaiting_final is not None:  # quitting already (the run time, then Locust's shutdown)
            finished.wait(FINAL_REPORT_S + 1)
            runner.greenlet.kill(block=True)
            return
        runner.stop(send_stop_to_client=False)
        workers = list(runner.clients.all)
        STATE.awaiting_final = {c.id for c in workers if c.state != "missing"}
        for client in workers:
            runner.server.send_to_client(Message("quit", None, client.id))
        deadline = time.monotonic() + FINAL_REPORT_S
        while time.monotonic() < deadline:
            # a worker that quit on its own (the group's Ctrl-C) or went missing sends nothing more
            STATE.awaiting_final &= {c.id for c in runner.clients.all if c.state != "missing"}
            if not STATE.awaiting_final:
                break
            gevent.sleep(0.05)
        if STATE.awaiting_final:
            log.warning("loadgen: %d worker(s) sent no final report within %g s: the records they had not "
                        "reported are missing from the run directory", len(STATE.awaiting_final), FINAL_REPORT_S)
        finished.set()
        runner.greenlet.kill(block=True)

    runner.quit = quit_after_reports  # type: ignore[method-assign]


def _watch_workers(runner: MasterRunner) -> None:
    """The master, every second: workers Locust found missing (``State.look_for_lost_workers``)."""
    while True:
        gevent.sleep(1.0)
        STATE.look_for_lost_workers(runner)


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
            row["failure_classes"] or "none", row["output_tokens"], row["output_tok_s"] or 0.0,
            "-" if row["stream_tok_s"] is None else f"{row['stream_tok_s']:.1f}",  # (none: no request decoded)
        )
    opts = environment.parsed_options
    csv_prefix = getattr(opts, "csv_prefix", None)
    if csv_prefix:
        _final_csv(environment, csv_prefix)
        Path(f"{csv_prefix}_llm.csv").write_text(rows_csv(rows))
    if STATE.sink is not None and STATE.plan is not None:
        STATE.sink.provenance.served_model(STATE.model)
        runner = environment.runner
        STATE.sink.provenance.note(workers=runner.worker_count if isinstance(runner, MasterRunner) else 0)
        if isinstance(runner, MasterRunner):  # by worker: the requests it sent, by its own count, and those on record
            STATE.sink.provenance.note(requests_by_worker=STATE.requests_by_worker())
        STATE.cells.close(now_s())
        STATE.sink.close(STATE.applied(), interrupted=_stopped(), server=_server(environment),
                         probes=tuple(STATE.probes), lost=STATE.workers_lost)
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
        {"key": "llm", "structure": [{"key": k, "title": title} for k, title in TAB_COLUMNS]}
    ]
    web_ui.template_args["extended_csv_files"] = [
        {"href": "./llm/stats/csv", "title": "Download LLM statistics CSV (tokens/s per worker and total)"}
    ]

    @web_ui.app.after_request
    def _add_llm_stats(response: Response) -> Response:
        if request.path.endswith("/stats/requests") and response.is_json:
            data = response.get_json()
            data["extended_stats"] = [{"key": "llm", "data": tab_rows(STATE.rows(), STATE.run_totals)}]
            response.set_data(orjson.dumps(data))
        return response

    @web_ui.app.route("/llm/quit", methods=["POST"])
    @web_ui.auth_required_if_enabled
    def _quit() -> Any:
        # the web UI's own way out (Ctrl-C was the only one, and it labels the run interrupted):
        # Locust's clean stop, as when a headless run ends: the test stopped, the run directory
        # written, Locust's exit code (0 unless requests failed)
        log.info("loadgen: quit from the web UI: stopping the test and writing the run directory")
        gevent.spawn_later(0.2, os.kill, os.getpid(), signal.SIGTERM)
        return jsonify({"quitting": True})

    @web_ui.app.route("/llm/stats")
    @web_ui.auth_required_if_enabled
    def _llm_stats() -> Any:
        return jsonify({"entries": list(ENTRIES), "rows": STATE.rows(), "users": environment.runner.user_count
                        if environment.runner is not None else 0})

    @web_ui.app.after_request
    def _add_llm_charts(response: Response) -> Response:
        # the start page and the LLM tab: loadgen's script adds the scenario under the form and
        # the live charts under the LLM table; the downloadable report: the LLM figures as a
        # static block. Each goes before the page's own closing </body>, its last: Locust's
        # inline scripts hold that text in strings of their own
        if response.mimetype == "text/html" and not response.direct_passthrough:
            page = response.get_data()
            end = page.rfind(b"</body>")
            if end < 0 or b"window.templateArgs" not in page:
                return response
            if request.path.endswith("/stats/report"):
                added = report_section(STATE.rows(users=STATE.peak_users or None)).encode()
            elif b"llm/charts.js" not in page:
                added = b'<script src="./llm/charts.js"></script>'
            else:
                return response
            response.set_data(page[:end] + added + page[end:])
        return response

    @web_ui.app.route("/llm/charts.js")
    def _llm_charts_js() -> Response:
        return Response(CHARTS_JS.read_text(), mimetype="text/javascript")

    @web_ui.app.route("/llm/history")
    @web_ui.auth_required_if_enabled
    def _llm_history() -> Any:
        runner = environment.runner
        return jsonify({"window_s": STATE.live.window_s, "points": STATE.live.history,
                        "state": runner.state if runner is not None else "ready"})

    @web_ui.app.route("/llm/scenario")
    @web_ui.auth_required_if_enabled
    def _llm_scenario() -> Any:
        return jsonify(STATE.describe(environment.host and redact_url(environment.host)))

    @web_ui.app.route("/llm/stats/csv")
    @web_ui.auth_required_if_enabled
    def _llm_stats_csv() -> Response:
        return Response(rows_csv(STATE.rows()), mimetype="text/csv",
                        headers={"Content-Disposition": "attachment;filename=llm_stats.csv"})
