"""Agent sessions from a file, driven as a user drives them (``loadgen run`` on a scenario
beside its session file) against the simulator, whose prompt counts are the truth: each
session replayed in order on one stream, its tool calls carried in the history and answered
with the file's results, its think times kept; the same conversation on the Responses API,
whole or by ``previous_response_id``."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from loadgen.cli import app
from loadgen.results.records import RequestRecord, read_records
from tests.conftest import StartSim
from tests.helpers.simtruth import sim_metrics
from tests.integration.report.test_llmd import reports

TOOLS = [{"type": "function", "function": {
    "name": "search_flights", "description": "flights to a city",
    "parameters": {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}}}]

SESSIONS = [
    {"system": "You are a careful travel agent", "turns": [
        {"user": "find me a flight to Paris", "tool_calls": ["search_flights"], "output_tokens": 8},
        {"tool_results": [{"flights": ["AF1"]}], "think_time_s": 0.2},
        {"user": "book it", "think_time_s": 0.1, "tool_calls": []},
    ]},
    {"turns": [{"user": "hello there"}, {"user": "bye", "think_time_s": 0.05}]},
]

# The simulator's prompt: 5 template tokens per message, a word per token, 3 for the answer's
# opening. Its answers with tool_choice auto: a call of the first function after a user message
# (the name, then JSON arguments {"to": "<words>"} whose words split as the arguments' tokens
# less 2: the quotes ride on the first and last word), text after a tool's result.
#   session 0, turn 0: system 5+6, user 5+6, opening 3                                   = 25
#              its answer: a call of 8 tokens: name + 5 argument words = 6, message 5+6   = 11
#        turn 1: 25-3 + answer 11 + tool result ('{"flights":["AF1"]}', 1 word) 5+1 + 3  = 42
#              its answer: 6 words of text (workload output_tokens), message 5+6          = 11
#        turn 2: 42-3 + 11 + user "book it" 5+2 + 3                                       = 60
#   session 1, turn 0: user 5+2, opening 3                                                = 10
#              its answer: a call of 6 tokens: name + 3 argument words, message 5+4       =  9
#        turn 1: 10-3 + 9 + an empty result for the call 5+0 + user "bye" 5+1 + 3        = 30
PROMPTS = {0: [25, 42, 60], 1: [10, 30]}
# On the Responses API a call's tokens are all arguments (the item added with the first names
# the function, as vLLM streams it): 8 tokens are the name and 6 words (message 12), 6 tokens
# the name and 4 words (message 10): 25, 22+12+6+3 = 43, 43-3+11+7+3 = 61; 10, 7+10+5+6+3 = 31.
RESPONSES_PROMPTS = {0: [25, 43, 61], 1: [10, 31]}
THINK = {(0, 1): 0.2, (0, 2): 0.1, (1, 1): 0.05}


def scenario(tmp_path: Path, api: str = "chat", history: str = "full") -> Path:
    (tmp_path / "sessions.jsonl").write_text("".join(json.dumps(s) + "\n" for s in SESSIONS))
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    path = tmp_path / "agents.yaml"
    path.write_text(f"name: agents\ntarget: {{api: {api}}}\n"
                    "workload:\n  output_tokens: 6\n  tools: {file: tools.json}\n"
                    f"  multi_turn: {{file: sessions.jsonl, history: {history}}}\n"
                    "load: {concurrency: 2, warmup_requests: 0}\n")
    return path


def run(tmp_path: Path, base_url: str, path: Path, name: str) -> tuple[list[RequestRecord], dict, str]:
    result = CliRunner().invoke(app, ["run", str(path), "--base-url", base_url, "--out", str(tmp_path / name)])
    assert result.exit_code == 0, result.output
    records = sorted((r for r in read_records(tmp_path / name / "records.jsonl") if not r.warmup),
                     key=lambda r: r.request_id)
    (cell,) = orjson.loads((tmp_path / name / "summary.json").read_bytes())["cells"]
    return records, cell, " ".join(result.output.split())


def by_session(records: list[RequestRecord]) -> dict[int, list[RequestRecord]]:
    out: dict[int, list[RequestRecord]] = {}
    for r in records:
        out.setdefault(r.request_id // 3, []).append(r)  # request id: session * its longest session's turns + turn
    return out


def test_a_session_file_is_replayed_in_order_with_tool_calls_answered_and_think_times_kept(
    start_sim: StartSim, tmp_path: Path,
) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=2)
    records, cell, output = run(tmp_path, base_url, scenario(tmp_path), "run")
    sessions = by_session(records)
    assert {s: [r.turn for r in rs] for s, rs in sessions.items()} == {0: [0, 1, 2], 1: [0, 1]}
    assert {s: [r.prompt_tokens for r in rs] for s, rs in sessions.items()} == PROMPTS
    for s, rs in sessions.items():
        for t, (a, b) in enumerate(zip(rs, rs[1:], strict=False), 1):
            assert a.done_at is not None
            assert b.sent_at is not None
            assert b.sent_at - a.done_at >= THINK[(s, t)]  # the file's own pause before the turn
            assert b.sent_at - a.done_at < THINK[(s, t)] + 0.1
    s0, s1 = sessions[0], sessions[1]
    # the calls' tokens are output; the answer after a tool's result is text
    assert [(r.output_tokens, r.tool_call_tokens) for r in s0] == [(8, 8), (6, 0), (6, 6)]
    assert [r.expected_tool_call for r in s0] == [True, None, False]  # turn 2 expected none and got one
    assert [(r.output_tokens, r.tool_call_tokens) for r in s1] == [(6, 6), (6, 6)]  # each after a user message
    assert [r.expected_tool_call for r in s1] == [None, None]
    assert all(r.input_tokens is None for r in records)  # the file's text, sent as it is
    calls = cell["metrics"]["tool_calls"]
    assert (calls["requests"], calls["expected_turns"], calls["as_expected"]) == (4, 2, 0.5)
    assert "as the session file expected in 50% of 2 turns" in output
    assert [t["requests"] for t in cell["metrics"]["turns"]] == [2, 2, 1]
    # llm-d's report of it (its sessions' turns vary: up to the file's longest, 3)
    (llmd,) = reports(tmp_path / "run")
    assert llmd["scenario"]["load"]["standardized"]["multi_turn"] == {
        "enabled": True, "max_turns": {"distribution": "other", "value": 3, "max": 3}}


@pytest.mark.alone  # its first tokens are timed to 6 ms: a busy machine delayed the simulator's answers by
# 6 to 17 ms before its clock started (four readings in two CI runs), which its lateness does not show
@pytest.mark.timing
@pytest.mark.parametrize("history", ["full", "previous-response"])
def test_the_responses_api_carries_the_same_conversation(start_sim: StartSim, tmp_path: Path, history: str) -> None:
    """Whole, or with only what is new and the previous answer's id: the simulator sees the
    same conversation, so each turn's prompt is as long as on chat."""
    base_url = start_sim(ttft_ms=20, itl_ms=2)
    records, cell, _ = run(tmp_path, base_url, scenario(tmp_path, "responses", history), history)
    sessions = by_session(records)
    assert {s: [r.prompt_tokens for r in rs] for s, rs in sessions.items()} == RESPONSES_PROMPTS
    assert [(r.output_tokens, r.tool_call_tokens) for r in sessions[0]] == [(8, 8), (6, 0), (6, 6)]
    alone = [r for r in records if r.chunk_offsets_s[0] != r.chunk_offsets_s[1]]
    # within 6 ms and the simulator's latest chunk (a busy machine puts its timers off: 8 ms once,
    # in a clean-clone CI run)
    late = sim_metrics(base_url)["loadgen_sim_chunk_lateness_seconds_max"]
    for r in alone:  # the first token: the call's first arguments, or the text's
        assert r.ttft_s == pytest.approx(0.020, abs=0.006 + late)
    # (a client held up on a busy machine reads several tokens at once, TCP having merged them:
    # they share the read's time, which the record counts)
    assert all(r.coalesced_reads >= 1 for r in records if r not in alone)
    assert alone  # the check above is not empty (how many, depends on how busy the machine is)
    assert cell["metrics"]["tool_calls"]["as_expected"] == 0.5


def test_a_bad_session_file_is_one_line_naming_the_line_and_field(tmp_path: Path) -> None:
    for lines, needle in (
        (['{"turns": []}'], "sessions.jsonl:1: a session needs turns"),
        (['{"turns": [{"user": "hi"}]}', "not json"], "sessions.jsonl:2: not JSON; give one session per line"),
        (['{"turns": [{"tool_results": ["x"]}]}'], "sessions.jsonl:1: turns[0] needs user"),
        (['{"turns": [{"user": "hi", "think_time_s": -1}]}'], "sessions.jsonl:1: turns[0].think_time_s: give seconds"),
        (['{"turns": [{"user": "hi", "output": 3}]}'], "sessions.jsonl:1: turns[0]: unknown key 'output'"),
        (['{"turns": [{"user": "hi"}, {}]}'], "turns[1]: give user (a message) or tool_results"),
        (['{"turns": [{"user": "hi", "tool_calls": "f"}]}'], "turns[0].tool_calls: give the names of the functions"),
        (['{"turns": [{"user": "hi", "output_tokens": 0}]}'], "turns[0].output_tokens: give a whole number"),
    ):
        (tmp_path / "sessions.jsonl").write_text("\n".join(lines) + "\n")
        path = tmp_path / "s.yaml"
        path.write_text("target: {api: chat}\nworkload: {multi_turn: {file: sessions.jsonl}}\n")
        result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "run")])
        assert result.exit_code == 2, result.output
        assert needle in " ".join(result.output.split()), result.output
    for body, needle in (
        ("target: {api: chat}\nworkload: {multi_turn: {file: nope.jsonl}}\n", "workload.multi_turn.file -> no such"),
        ("target: {api: chat}\nworkload: {multi_turn: {turns: 2, file: sessions.jsonl}}\n",
         "give turns (generated sessions) or file"),
        ("target: {api: chat}\nworkload: {multi_turn: {turns: 2, history: previous-response}}\n",
         "set target.api: responses"),
        ("target: {api: chat}\nworkload: {multi_turn: {file: sessions.jsonl, system_tokens: 8}}\n",
         "a session file gives its own system prompts"),
    ):
        path = tmp_path / "s.yaml"
        path.write_text(body)
        result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "run")])
        assert result.exit_code == 2, result.output
        assert needle in " ".join(result.output.split()), result.output
    # a call the tools do not define (or no tools at all): named before the run, not counted as unmet
    (tmp_path / "sessions.jsonl").write_text(json.dumps(SESSIONS[0]).replace("search_flights", "book_hotel") + "\n")
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    for tools, defined in (("tools: {file: tools.json}, ", "search_flights"),
                           ("", "none: the scenario gives no workload.tools")):
        path.write_text(f"target: {{api: chat}}\nworkload: {{{tools}multi_turn: {{file: sessions.jsonl}}}}\n")
        result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "run")])
        assert result.exit_code == 2, result.output
        assert (f"sessions.jsonl:1: turns[0].tool_calls: 'book_hotel' is not a function of workload.tools "
                f"(defined: {defined})") in " ".join(result.output.split()), result.output
