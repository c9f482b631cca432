"""Workloads against the simulator's truth: a dataset's output lengths, a trace's schedule, a
ramp's rates, stages, multi-turn sessions and the prefix cache per turn, reasoning streams,
and a server that refuses ignore_eos."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loadgen.load.run import execute
from loadgen.load.schedule import ramp_rate
from loadgen.results.records import RequestRecord, read_records
from loadgen.results.rundir import PROVENANCE, RECORDS
from loadgen.scenario.loader import parse_scenario
from tests.conftest import StartSim
from tests.helpers.simtruth import mean_lateness, sim_metrics


def measured(run_dir: Path) -> list[RequestRecord]:
    return sorted((r for r in read_records(run_dir / RECORDS) if not r.warmup), key=lambda r: r.request_id)


def run(base_url: str, tmp_path: Path, workload: dict[str, Any], load: dict[str, Any] | None = None,
        **extra: Any) -> Path:
    sc = parse_scenario({"name": "w", "seed": 5, "target": {"base_url": base_url, **extra.pop("target", {})},
                         "workload": workload, "load": {"warmup_requests": 0, **(load or {})}, **extra})
    out = tmp_path / "run"
    execute(sc, out)
    return out


def test_a_sharegpt_file_gives_each_request_its_answers_length(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=2, itl_ms=0.2)
    entries = [{"id": str(i), "conversations": [
        {"from": "human", "value": " ".join(f"p{i}w{j}" for j in range(5 + i))},
        {"from": "gpt", "value": " ".join("a" for _ in range(4 + 3 * i))},
    ]} for i in range(12)]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(entries))
    out = run(base_url, tmp_path, {"num_prompts": 12, "dataset": {"kind": "sharegpt", "path": str(path),
                                                                  "shuffle": False}}, {"concurrency": 4})
    records = measured(out)
    assert [r.output_tokens for r in records] == [4 + 3 * i for i in range(12)]  # the server streamed each
    assert [r.max_tokens for r in records] == [4 + 3 * i for i in range(12)]
    # input lengths from the server's usage: the simulator counts words, as the dataset was counted
    assert [r.prompt_tokens for r in records] == [5 + i for i in range(12)]
    assert [r.input_tokens for r in records] == [5 + i for i in range(12)]


@pytest.mark.timing
@pytest.mark.alone  # a 1 ms bound on when requests are sent: other tests' work would be in it
def test_a_trace_is_sent_on_its_schedule_with_shared_blocks(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=2, itl_ms=0.5)
    stamps = [0, 40, 45, 200, 260, 300, 480, 500]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"timestamp": 1000 + t, "input_length": 40, "output_length": 3 + i,
                                        "hash_ids": [7, 100 + i]}) + "\n" for i, t in enumerate(stamps)))
    sc = parse_scenario({"name": "t", "seed": 1, "target": {"base_url": base_url},
                         "workload": {"trace": {"file": str(path), "block_tokens": 16}},
                         "load": {"warmup_requests": 0}})
    execute(sc, tmp_path / "run")
    records = measured(tmp_path / "run")
    assert len(records) == len(stamps)
    first = records[0].scheduled_at
    lateness = []
    for r, t in zip(records, stamps, strict=True):
        assert r.sent_at is not None
        assert abs((r.scheduled_at - first) - t / 1000) < 1e-6  # the trace's own times
        assert r.sent_at >= r.scheduled_at  # never before them
        lateness.append(r.sent_at - r.scheduled_at)
        assert r.output_tokens == 3 + r.request_id
        assert r.prompt_tokens == 40
    # sent within 1 ms of them (a request due while the client reads another's tokens on a
    # busy 2-core machine may now and then wait a little longer: the self-check reports that)
    assert float(np.median(lateness)) < 0.001
    assert max(lateness) < 0.005
    # hash id 7 is the same 16-token block in every request: all but the first find it cached
    assert [r.cached_tokens for r in records] == [0] + [16] * (len(stamps) - 1)


@pytest.mark.timing
@pytest.mark.alone
def test_a_ramp_up_sends_at_the_rate_of_its_schedule(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=1, itl_ms=0.1)
    out = run(base_url, tmp_path, {"num_prompts": 90, "input_tokens": 8, "output_tokens": 2},
              {"concurrency": "unlimited", "arrival": "constant",
               "ramp_up": {"strategy": "linear", "start_rate": 20, "end_rate": 70}})
    records = measured(out)
    scheduled = np.array([r.scheduled_at for r in records])
    sent = np.array([r.sent_at for r in records])
    late = sent - scheduled
    sent -= scheduled[0]
    # rate of request i is 20 + 50 * i / 89; request i+1 follows 1 / rate(i+1) after it
    expected = np.concatenate(([0.0], np.cumsum([1 / ramp_rate("linear", 20, 70, i, 90) for i in range(1, 90)])))
    assert np.max(np.abs(scheduled - scheduled[0] - expected)) < 1e-6  # the schedule: the ramp itself
    # each send at its place on the ramp, never before; half within 1 ms of it, all within 10 ms
    # (the gaps are 14 to 50 ms; a 2-core machine running the whole suite has woken the client
    # 5.2 ms late, the self-check's business)
    assert np.min(late) >= 0
    assert float(np.median(late)) < 0.001
    assert np.max(late) < 0.010
    # per whole second, the count of sends against the ramp's rate there (within 5%)
    for second in range(int(expected[-1])):
        got = int(np.sum((sent >= second) & (sent < second + 1)))
        want = int(np.sum((expected >= second) & (expected < second + 1)))
        assert abs(got - want) <= max(1, 0.05 * want)


def test_stages_tag_their_requests_and_hold_their_rates(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=1, itl_ms=0.1)
    out = run(base_url, tmp_path, {"num_prompts": 10, "input_tokens": 8, "output_tokens": 2},
              {"arrival": "constant", "stages": [{"duration_s": 0.5, "rate": 20}, {"duration_s": 0.5, "rate": 60}]})
    records = measured(out)
    assert {r.stage for r in records} == {0, 1}
    assert sum(r.stage == 0 for r in records) == 10  # 0, 0.05, ..., 0.45 s
    assert sum(r.stage == 1 for r in records) == 30
    assert sorted(r.request_id for r in records) == list(range(40))  # ids run on across stages
    summary = json.loads((out / "summary.json").read_text())
    stages = summary["cells"][0]["metrics"]["stages"]
    assert [s["requests"] for s in stages] == [10, 30]


def test_multi_turn_sessions_send_the_history_the_server_gave(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=2, itl_ms=0.2)
    out = run(base_url, tmp_path, {"num_prompts": 3, "input_tokens": 20, "output_tokens": 10,
                                   "multi_turn": {"turns": 4, "think_time_s": 0.02, "system_tokens": 64}},
              {"concurrency": 2}, target={"api": "chat"})
    records = measured(out)
    assert len(records) == 12
    by_session: dict[int, list[RequestRecord]] = {}
    for r in records:
        by_session.setdefault(r.request_id // 4, []).append(r)
    for turns in by_session.values():
        assert [r.turn for r in turns] == [0, 1, 2, 3]
        prompts = [r.prompt_tokens or 0 for r in turns]
        # turn 0: the system prompt and the message with their templates (5 tokens each) and the
        # assistant's opening (3); each later turn adds the previous answer (10 words, as the
        # simulator sent them) and a new 20-token message, each with its 5 template tokens
        assert prompts[0] == 5 + 64 + 5 + 20 + 3
        assert all(b - a == 5 + 10 + 5 + 20 for a, b in zip(prompts, prompts[1:], strict=False))
        # the next turn starts after the answer and the think time
        for a, b in zip(turns, turns[1:], strict=False):
            assert b.sent_at is not None
            assert a.done_at is not None
            assert b.sent_at - a.done_at >= 0.02
    summary = json.loads((out / "summary.json").read_text())
    per_turn = summary["cells"][0]["metrics"]["turns"]
    assert [t["turn"] for t in per_turn] == [0, 1, 2, 3]
    assert per_turn[0]["prefix_cache_hit_rate"] == 0.0  # sessions share nothing with each other
    assert all(t["prefix_cache_hit_rate"] > 0.5 for t in per_turn[1:])


@pytest.mark.timing
@pytest.mark.alone  # 4 ms bounds on 4 requests' p50: other tests' work would be in them
def test_a_reasoning_stream_gives_ttft_at_the_first_thought_and_the_answer_apart(
    start_sim: StartSim, tmp_path: Path,
) -> None:
    base_url = start_sim(ttft_ms=30, itl_ms=5, reasoning_tokens=6)
    out = run(base_url, tmp_path, {"num_prompts": 4, "input_tokens": 16, "output_tokens": 10}, target={"api": "chat"})
    summary = json.loads((out / "summary.json").read_text())
    m = summary["cells"][0]["metrics"]
    # within 4 ms and the simulator's own mean lateness on this machine at the time, thrice
    sim = sim_metrics(base_url)
    bound = 0.004 + 3 * mean_lateness(sim)
    assert abs(m["ttft_s"]["p50"] - 0.030) < bound  # the first token of any kind
    assert m["reasoning"]["reasoning_tokens_total"] == 4 * 6
    assert abs(m["reasoning"]["time_to_answer_s"]["p50"] - (0.030 + 6 * 0.005)) < bound
    assert all(r.output_tokens == 10 for r in measured(out))


def test_a_server_refusing_ignore_eos_is_measured_without_it_and_says_so(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=2, itl_ms=0.2, reject_params=("ignore_eos",))
    messages: list[str] = []

    class Listen:
        def message(self, text: str) -> None:
            messages.append(text)

        def preparing(self, *a: object) -> None: ...
        def cell_started(self, *a: object) -> None: ...
        def record(self, *a: object) -> None: ...
        def cell_finished(self, *a: object) -> None: ...

    sc = parse_scenario({"name": "r", "target": {"base_url": base_url},
                         "workload": {"num_prompts": 5, "input_tokens": 8, "output_tokens": 4}})
    execute(sc, tmp_path / "run", observer=Listen())
    assert sum("refuses ignore_eos" in m for m in messages) == 1
    records = measured(tmp_path / "run")
    assert len(records) == 5
    assert all(r.ok for r in records)
    provenance = json.loads((tmp_path / "run" / PROVENANCE).read_text())
    assert provenance["params_dropped"]["params"] == ["ignore_eos"]
