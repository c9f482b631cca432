"""The pure parts of the Locust integration: plan checks, clock rebasing, steps, live stats,
and the locust command line ``loadgen locust`` builds."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import orjson
import pytest

from loadgen.errors import ScenarioError, UsageError
from loadgen.load.stream import StreamState
from loadgen.locust.cli import LOCUSTFILE, SHAPEFILE, locust_command
from loadgen.locust.plan import (
    CellClock,
    arrivals_in_words,
    locust_scenario,
    plan_for,
    rebase,
    schedule,
    segments,
)
from loadgen.locust.stats import CSV_COLUMNS, LiveStats, rows_csv
from loadgen.results.cellstatus import AppliedUsers, CellStatus, LostWorker, ServerInfo
from loadgen.results.records import RequestRecord
from loadgen.scenario.loader import parse_scenario
from loadgen.scenario.matrix import expand_cells

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


def record(
    rid: int, sent: float, offsets: tuple[float, ...], tokens: tuple[int, ...], *,
    worker: int = 0, error: str | None = None, prompt: int = 10,
) -> RequestRecord:
    return RequestRecord(
        request_id=rid, cell=0, warmup=False, scheduled_at=sent, sent_at=sent,
        first_token_at=sent + offsets[0] if offsets else None,
        last_token_at=sent + offsets[-1] if offsets else None,
        done_at=sent + (offsets[-1] if offsets else 0.5) + 0.001,
        input_tokens=prompt, max_tokens=sum(tokens), prompt_tokens=prompt, output_tokens=sum(tokens),
        token_count_source="usage", chunk_tokens_total=sum(tokens), chunk_offsets_s=offsets,
        chunk_tokens=tokens, status=200, error=error, error_detail=None if error is None else "x",  # type: ignore[arg-type]
        worker=worker,
    )


def test_plan_of_the_chat_scenario() -> None:
    plan = plan_for(parse_scenario({
        "workload": {"input_tokens": 256, "output_tokens": 128},
        "load": {"concurrency": [1, 8, 32], "duration_s": 60},
    }), "chat.yaml")
    assert (plan.input_tokens, plan.output_tokens, plan.steps, plan.step_s) == (256, 128, (1, 8, 32), 60.0)


@pytest.mark.parametrize(("data", "field"), [
    ({"workload": {"input_tokens": [128, 256]}}, "workload.input_tokens"),
    ({"load": {"rate": [4, 8]}}, "load.rate"),
    ({"load": {"concurrency": "unlimited"}}, "load.concurrency"),
    ({"serve": {"backend": "sim"}, "matrix": {"serve.sim.ttft_ms": [10, 20]}}, "matrix"),
    ({"load": {"stages": [{"duration_s": 5, "rate": 4}, {"duration_s": 5, "concurrency": 2}]}}, "load.stages"),
    ({"load": {"stages": [{"duration_s": 5, "rate": 4, "concurrency": 2}]}}, "load.stages"),
    ({"load": {"search": {"by": "rate", "slo": {"ttft_ms": {"p99": 300}}}}}, "load.search.by"),
    ({"target": {"api": "chat"}, "workload": {"multi_turn": {"turns": 2}}, "load": {"rate": 2}}, "load.rate"),
])
def test_plan_refuses_load_locust_cannot_apply(data: dict[str, object], field: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        plan_for(parse_scenario(data), "x.yaml")
    assert str(exc.value).startswith(f"x.yaml: {field} -> ")


def test_an_open_loop_is_one_schedule_shared_out_between_processes() -> None:
    """A rate, a ramp or stages at a rate: one schedule from the run's seed, whose arrivals i,
    i + n, ... go to process i of n; the run directory's scenario keeps the rate beside the
    users (its most in flight)."""
    plan = plan_for(parse_scenario({"load": {"rate": 10, "arrival": "constant"}}), "x.yaml")
    assert plan.open_loop
    made = schedule(plan, 7)
    assert made is not None
    assert made[1] is None
    assert list(itertools.islice(made[0], 4)) == pytest.approx([0.0, 0.1, 0.2, 0.3])
    cell = expand_cells(locust_scenario(plan, (6,)))[0]
    assert (cell.rate, cell.concurrency) == (10, 6)
    # Poisson: the same seed, the same schedule in every process
    poisson = plan_for(parse_scenario({"load": {"rate": 5}}), "x.yaml")
    a, b = schedule(poisson, 3), schedule(poisson, 3)
    assert a is not None
    assert b is not None
    assert list(itertools.islice(a[0], 50)) == list(itertools.islice(b[0], 50))
    # a ramp: num_prompts arrivals, each gap at its request's rate (1, 2, 3 per second: 1/2, then 1/3)
    ramp = plan_for(parse_scenario({"workload": {"num_prompts": 3}, "load": {
        "arrival": "constant", "ramp_up": {"strategy": "linear", "start_rate": 1, "end_rate": 3}}}), "x.yaml")
    made = schedule(ramp, 0)
    assert made is not None
    assert made[1] == 3
    assert list(made[0]) == pytest.approx([0.0, 1 / 2, 1 / 2 + 1 / 3])
    # stages at a rate, back to back: 2/s for 1 s, then 4/s for 1 s
    staged = plan_for(parse_scenario({"load": {"arrival": "constant", "stages": [
        {"duration_s": 1, "rate": 2}, {"duration_s": 1, "rate": 4}]}}), "x.yaml")
    made = schedule(staged, 0)
    assert made is not None
    assert list(made[0]) == pytest.approx([0.0, 0.5, 1.0, 1.25, 1.5, 1.75])
    closed = plan_for(parse_scenario({"load": {"concurrency": 4}}), "x.yaml")
    assert schedule(closed, 0) is None
    # as the web UI's start page says them
    assert arrivals_in_words(plan) == "10/s (constant); each user has one request in flight"
    assert arrivals_in_words(ramp).startswith("ramp-up 1 to 3/s over 3 requests (constant)")
    assert arrivals_in_words(staged).startswith("2/s for 1 s, 4/s for 1 s (constant)")
    assert arrivals_in_words(closed) is None


def test_run_directory_scenario_holds_the_users_it_ran_with() -> None:
    plan = plan_for(parse_scenario({"load": {"concurrency": [1, 8], "warmup_requests": 3}}), "x.yaml")
    cells = expand_cells(locust_scenario(plan, (1, 8)))
    assert [c.concurrency for c in cells] == [1, 8]
    one = locust_scenario(plan, (20,))
    assert one.load.concurrency == (20,)
    assert one.load.warmup_requests == 0  # Locust sends no warmup


def test_rebase_moves_times_and_keeps_offsets() -> None:
    r = record(7, 1.0, (0.05, 0.06), (1, 1))
    moved = rebase(r.to_json(), 2.5, 42, 3)
    assert moved.request_id == 42
    assert moved.worker == 3
    assert moved.sent_at == pytest.approx(3.5)
    assert moved.scheduled_at == pytest.approx(3.5)
    assert moved.first_token_at == pytest.approx(3.55)
    assert moved.last_token_at == pytest.approx(3.56)
    assert moved.done_at == pytest.approx(3.561)
    assert moved.chunk_offsets_s == (0.05, 0.06)
    assert moved.chunk_tokens == (1, 1)


def test_each_test_and_each_step_is_a_cell_with_the_users_it_ran() -> None:
    clock = CellClock()
    assert clock.cell_of(5.0) == 0
    # test 1 from 1 s: users ramp 0 -> 2 -> 4 at 1 user/s and hold 4 until the stop at 11 s
    clock.open(1.0, 0, new_test=True)
    for t, users in ((1.0, 1), (2.0, 2), (3.0, 3), (4.0, 4), (8.0, 4)):
        clock.see(t, users)
    clock.close(11.0)
    clock.see(12.0, 0)  # after the stop: not the test's
    # test 2 at 21 s, 8 users at once; its shape's second step at 31 s, 16 users, running at 35 s
    clock.open(21.0, 8, new_test=True)
    clock.open(31.0, 16, new_test=False)
    assert [clock.cell_of(t) for t in (0.5, 1.0, 10.99, 20.0, 21.0, 30.9, 31.0, 99.0)] == [0, 0, 0, 0, 1, 1, 2, 2]
    assert clock.cell_of(None) == 0
    first, second, third = (seen.applied(35.0) for seen in clock.users)
    # 1 x 1 + 2 x 1 + 3 x 1 + 4 x 7 = 34 user-seconds over the 10 s the test ran
    assert first == AppliedUsers(test=1, first=1, peak=4, mean=3.4, ramp_s=3.0, duration_s=10.0)
    assert first.text() == "Locust test 1: 1 to 4 users over 3.0 s, mean 3.4 over 10.0 s"
    assert second == AppliedUsers(test=2, first=8, peak=8, mean=8.0, ramp_s=0.0, duration_s=10.0)
    assert second.text() == "Locust test 2: 8 users, mean 8.0 over 10.0 s"
    assert third == AppliedUsers(test=2, first=16, peak=16, mean=16.0, ramp_s=0.0, duration_s=4.0)


def test_live_stats_by_hand() -> None:
    live = LiveStats(window_s=2)
    # worker 1: 3 tokens at 10.2, 10.3, 11.4 (sent 10.0); worker 2: 2 tokens (one chunk of 2) at 11.5
    live.add(record(0, 10.0, (0.2, 0.3, 1.4), (1, 1, 1), worker=1))
    live.add(record(1, 11.0, (0.5,), (2,), worker=2))
    live.add(record(2, 11.0, (), (), worker=2, error="http_status"))
    live.add(record(3, 11.0, (0.1,), (1,), worker=2, error="cancelled"))
    rows = live.rows(now_s=12.0, users=4)
    assert [r["name"] for r in rows] == ["worker 1", "worker 2", "Total"]
    w1, w2, total = rows
    # worker 1: 3 tokens over sent 10.0 .. done 11.401
    assert w1["output_tok_s"] == round(3 / 1.401, 1)
    # decode speed: (3 - 1) tokens over 1.4 - 0.2 s
    assert w1["stream_tok_s"] == round(2 / 1.2, 1)
    assert (w2["requests"], w2["failures"], w2["failure_classes"]) == (2, 1, "http_status 1")
    assert w2["stream_tok_s"] is None  # one chunk: no decode interval
    assert (total["requests"], total["failures"], total["output_tokens"], total["prompt_tokens"]) == (3, 1, 5, 20)
    # whole seconds 10 and 11 hold 2 and 3 tokens: 5 over a 2 s window
    assert total["recent_tok_s"] == 2.5
    assert total["tok_s_per_user"] == round(2.5 / 4, 1)
    # with the master's report lag only second 10 has passed since the first request: 2 tokens
    assert live.recent_rate(12.0, lag_s=1.0) == 2.0
    # later, the window is the last 2 whole seconds: 12 and 13 hold nothing
    assert live.recent_rate(14.0) == 0.0
    assert rows_csv(rows).splitlines()[3].startswith('"Total",3,1,"http_status 1",5,20,')
    # exact percentiles over the two successful requests: TTFT 200 and 500 ms, E2E 1401 and 501 ms
    assert (total["ttft_p50_ms"], total["ttft_p99_ms"]) == (350.0, round(200 + 0.99 * 300, 2))
    assert total["e2e_p50_ms"] == 951.0
    # ITL: the first request's gaps 100 and 1100 ms; the second has one chunk and none. TPOT:
    # (1400 - 200) / 2 = 600 ms and 0 (both tokens in its one chunk)
    assert (total["itl_p50_ms"], total["tpot_p50_ms"]) == (600.0, 300.0)
    # a chart point at 12.0: the window ends behind the longest request (1.401 s), at 10.599, and
    # holds 0.599 s since the first send, with 0.599 / 1.401 of the first request: 1 / 1.401 req/s
    point = live.sample(12.0, users=4)
    assert (point["requests_s"], point["ttft_p50_ms"], point["users"]) == (round(1 / 1.401, 3), 350.0, 4)
    assert point["output_tok_s"] == 2.5
    assert live.history == [point]
    live.reset()
    assert live.rows(12.0, 0)[0]["requests"] == 0


def test_one_process_shows_only_the_total() -> None:
    live = LiveStats()
    live.add(record(0, 1.0, (0.1,), (1,)))
    assert [r["name"] for r in live.rows(2.0, 1)] == ["Total"]


def splits(body: bytes) -> list[list[bytes]]:
    """Every two-way split, and byte by byte."""
    return [[body[:i], body[i:]] for i in range(len(body) + 1)] + [[body[i:i + 1] for i in range(len(body))]]


def test_stream_state_across_any_split() -> None:
    body = (
        b'data: {"choices":[{"text":"a","finish_reason":null}],"usage":{"prompt_tokens":5,"completion_tokens":1}}\n\n'
        b'data: {"choices":[{"text":"bc","finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\n'
        b'data: [DONE]\n\n'
    )
    for parts in splits(body):
        st = StreamState()
        decided = False
        for t, part in enumerate(parts):
            decided = st.feed(part, 1000 + t) or decided
        assert decided
        assert st.end(9999) == (None, None)
        assert st.chunk_tokens == [1, 2]
        assert st.prompt_tokens == 5


@pytest.mark.parametrize(("body", "outcome"), [
    (b'data: {"choices":[{"text":"a","finish_reason":"stop"}]}\n\n', (None, None)),  # no [DONE], but finished
    (b'data: {"choices":[{"text":"a","finish_reason":null}]}\n\n', ("stream_cut", "stream ended before finish_reason or [DONE]")),
    (b'{"choices":[{"text":"a"}]}\n\n', ("malformed", "1 lines without an SSE field")),
])
def test_stream_state_outcomes_at_end_of_body(body: bytes, outcome: tuple[str | None, str | None]) -> None:
    st = StreamState()
    st.feed(body, 1)
    assert st.end(2) == outcome


def test_stream_state_stops_at_a_broken_chunk() -> None:
    st = StreamState()
    assert st.feed(b'data: {"choices":[{"text":"a"}]}\n\ndata: {oops\n\n', 1)
    assert st.outcome is not None
    assert st.outcome[0] == "malformed"
    assert st.chunk_tokens == [1]  # the token before the break is kept


def test_locust_command_defaults(tmp_path: Path) -> None:
    sc = str(SCENARIOS / "chat.yaml")
    cmd, plan = locust_command(["--scenario", sc, "--host", "http://h:1/v1", "-u", "5"])
    assert cmd[:3] == [sys.executable, "-m", "locust"]
    assert cmd[3:] == ["--scenario", sc, "--host", "http://h:1/v1", "-u", "5",
                       "-f", str(LOCUSTFILE), "--web-host", "127.0.0.1"]
    assert plan.steps == (1, 8, 32)
    cmd, _ = locust_command(["--scenario", sc, "--host", "x", "--web-host", "0.0.0.0"], shape=True, out=tmp_path)
    assert cmd[-4:] == ["-f", str(SHAPEFILE), "--loadgen-out", str(tmp_path)]
    assert "127.0.0.1" not in cmd
    # a directory that holds a run already: refused before Locust starts, and not with --resume
    # (a Locust test cannot continue a run)
    (tmp_path / "records.jsonl").write_text("")
    with pytest.raises(UsageError, match=r"already holds a run \(records.jsonl\); choose another --out or remove it$"):
        locust_command(["--scenario", sc, "--host", "x"], out=tmp_path)
    # a worker gets host and scenario from the master and has no web UI
    cmd, _ = locust_command(["--scenario", sc, "--worker", "--master-host", "10.0.0.5"])
    assert cmd[3:] == ["--scenario", sc, "--worker", "--master-host", "10.0.0.5", "-f", str(LOCUSTFILE)]


def test_processes_get_their_masters_port_and_a_taken_default_is_said(tmp_path: Path) -> None:
    """``--processes N``: Locust's forked workers connect to --master-port, its master binds
    --master-bind-port; either given, the other follows it (given alone, the workers waited for a
    master on Locust's default port). Neither given, Locust's default must be free."""
    import socket

    from loadgen.locust.cli import MASTER_PORT

    sc = str(SCENARIOS / "chat.yaml")
    base = ["--scenario", sc, "--host", "http://h:1/v1", "--headless", "--processes", "2"]
    cmd, _ = locust_command([*base, "--master-bind-port", "6001"])
    assert cmd[cmd.index("--master-port") + 1] == "6001"
    cmd, _ = locust_command([*base, "--master-port", "6002"])
    assert cmd[cmd.index("--master-bind-port") + 1] == "6002"
    cmd, _ = locust_command([*base, "--master-bind-port", "6001", "--master-port", "6001"])
    assert cmd.count("--master-port") == 1
    with socket.socket() as taken:
        try:
            taken.bind(("0.0.0.0", MASTER_PORT))  # noqa: S104 - Locust's own default binding
        except OSError:
            pytest.skip(f"port {MASTER_PORT} is in use here already")
        taken.listen()
        with pytest.raises(UsageError, match=f"--master-bind-port {MASTER_PORT}: .* is in use .*; give another "
                                             "--master-bind-port"):
            locust_command(base)


def test_locust_command_takes_the_host_from_the_scenario(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("target: {base_url: 'http://127.0.0.1:9/v1'}\n")
    cmd, _ = locust_command(["--scenario", str(path), "--set", "workload.output_tokens=7"])
    assert cmd[cmd.index("--host") + 1] == "http://127.0.0.1:9/v1"


@pytest.mark.parametrize(("args", "message"), [
    ([], "--scenario: give a loadgen scenario file"),
    (["--scenario", "{sc}"], "--host: give the server's base URL"),
    (["--scenario", "{sc}", "--host", "x", "--set", "load.rate=[2,4]"], "load.rate -> a Locust test runs one rate"),
    (["--scenario", "{sc}", "--host", "x", "-f", "mine.py"], "--shape uses loadgen's shape locustfile"),
])
def test_locust_command_errors(args: list[str], message: str) -> None:
    sc = str(SCENARIOS / "chat.yaml")
    with pytest.raises((UsageError, ScenarioError)) as exc:
        locust_command([a.replace("{sc}", sc) for a in args], shape="-f" in args)
    assert message in str(exc.value)


def test_rows_csv_quotes_names_and_leaves_missing_figures_empty() -> None:
    rows = [{"name": "Total", "requests": 1, "recent_tok_s": None}]
    assert rows_csv(rows).splitlines()[1] == '"Total",1' + "," * (len(CSV_COLUMNS) - 2)


def test_stream_state_classes_late_chunks_by_their_arrival_time() -> None:
    chunk = b'data: {"choices":[{"text":"a"}]}\n\n'
    late = StreamState(first_token_s=0.02)
    late.sent_ns = 1_000_000_000
    assert late.feed(chunk, 1_030_000_000)  # 30 ms: after the 20 ms first-token deadline
    assert late.outcome == ("timeout", "first token")
    assert late.chunk_tokens == []  # it came after the client had given up
    ok = StreamState(first_token_s=0.02, total_s=0.05)
    ok.sent_ns = 0
    assert not ok.feed(chunk, 10_000_000)
    assert not ok.feed(chunk, 45_000_000)
    assert ok.feed(chunk, 60_000_000)  # past the 50 ms total
    assert ok.outcome == ("timeout", "total")
    assert ok.chunk_tokens == [1, 1]


def test_stages_by_concurrency_are_the_shapes_steps() -> None:
    plan = plan_for(parse_scenario({"load": {"stages": [{"duration_s": 5, "concurrency": 4},
                                                        {"duration_s": 2.5, "concurrency": 16}]}}), "x.yaml")
    assert (plan.steps, plan.step_lengths) == ((4, 16), (5.0, 2.5))


def test_a_kind_of_failure_is_one_row_whatever_ids_its_messages_carry() -> None:
    from loadgen.locust.stats import failure_kind as _kind_of

    first = _kind_of("""not JSON: b'{"id":"chatcmpl-9f2c41ab","created":1732800000'""")
    assert first == _kind_of("""not JSON: b'{"id":"chatcmpl-77ab01cd","created":1732800007'""")
    assert first == """not JSON: b'{"id":"chatcmpl-#","created":#'"""
    assert _kind_of("HTTP 503: overloaded") != _kind_of("HTTP 500: overloaded")  # two kinds
    assert _kind_of("no token for 1.0 s") == "no token for 1.0 s"


def test_the_csv_and_the_tab_name_the_whole_test_alike() -> None:
    assert ("output_tok_s", "Output tok/s (whole test)") in CSV_COLUMNS
    assert not any("whole run" in label for _, label in CSV_COLUMNS)


def test_a_lost_worker_rides_its_cells_status_line_and_becomes_its_warning() -> None:
    lost = LostWorker(worker=2, node="host_ab12", at_s=8.04, users=4, unreported_s=5.84)
    status = CellStatus(0, "done", server=ServerInfo(), workers_lost=(lost,))
    line = orjson.loads(orjson.dumps(status.to_dict()))
    assert line["workers_lost"] == [{"worker": 2, "node": "host_ab12", "at_s": 8.04, "users": 4, "unreported_s": 5.84}]
    assert CellStatus.from_dict(line) == status
    assert lost.warning().startswith("worker 2 (host_ab12, 4 users) stopped answering its master 8.0 s into the "
                                     "test (its last report came 5.8 s before)")
    never = LostWorker(worker=1, node="h", at_s=3.0, users=0, unreported_s=None)
    assert "(it never reported)" in never.warning()
    # a status line of a run without a lost worker (or from before) has none
    assert CellStatus.from_dict({"cell": 0, "status": "done"}).workers_lost == ()
    assert "workers_lost" not in CellStatus(0, "done").to_dict()


def test_repeats_run_each_step_again_after_a_cooldown_each_a_cell(tmp_path: Path) -> None:
    plan = plan_for(parse_scenario({"load": {"concurrency": [2, 4], "repeats": 3, "cooldown_s": 1.5}}), "x.yaml")
    assert (plan.steps, plan.repeats, plan.cooldown_s) == ((2, 4), 3, 1.5)
    # each step's repeats in turn, the cooldown (no user, no cell) before each repeat after the first
    assert segments(plan, 10.0) == (
        (2, 10.0, True), (0, 1.5, False), (2, 10.0, True), (0, 1.5, False), (2, 10.0, True),
        (4, 10.0, True), (0, 1.5, False), (4, 10.0, True), (0, 1.5, False), (4, 10.0, True),
    )
    # the run directory's cells are loadgen run's for the same scenario: each step's repeats in turn
    cells = expand_cells(locust_scenario(plan, (2, 2, 2, 4, 4, 4)))
    assert [(c.concurrency, c.repeat) for c in cells] == [(2, 1), (2, 2), (2, 3), (4, 1), (4, 2), (4, 3)]
    # no cooldown: the repeats back to back; stages: each its own length, no repeat
    assert segments(plan_for(parse_scenario({"load": {"concurrency": 2, "repeats": 2}}), "x.yaml"), 5.0) == (
        (2, 5.0, True), (2, 5.0, True))
    staged = plan_for(parse_scenario({"load": {"stages": [{"concurrency": 2, "duration_s": 3},
                                                          {"concurrency": 6, "duration_s": 4}]}}), "x.yaml")
    assert segments(staged, 60.0) == ((2, 3.0, True), (6, 4.0, True))
    # an open loop runs once a test: refused in a line that names the way to repeat it
    with pytest.raises(ScenarioError, match=r"^x.yaml: load.repeats -> .*run the repeats with loadgen run$"):
        plan_for(parse_scenario({"load": {"rate": 5, "repeats": 2}}), "x.yaml")
    # the shape runs the repeats: without it, said before Locust starts
    path = tmp_path / "r.yaml"
    path.write_text("name: r\nload: {concurrency: 2, repeats: 2}\n")
    with pytest.raises(UsageError, match=r"load.repeats -> add --shape: the shape runs each step's repeats$"):
        locust_command(["--scenario", str(path), "--host", "x"])
