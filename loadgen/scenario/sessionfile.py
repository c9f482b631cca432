"""Agent sessions from a file (``workload.multi_turn.file``): JSONL, one session per line.

    {"system": "You are a travel agent.", "turns": [
      {"user": "Find me a flight to Paris on Friday", "tool_calls": ["search_flights"]},
      {"tool_results": ["{\\"flights\\": [\\"AF1234\\"]}"], "think_time_s": 0.3},
      {"user": "Book the first one", "think_time_s": 4.0, "output_tokens": 200}]}

Each turn is one request. ``user`` is the user's message; ``tool_results`` answer the tool
calls the previous answer made (the n-th call gets the n-th result, the list taken in turn
where there are more calls); ``tool_calls`` names the functions the turn's answer is expected
to call (``[]``: none); ``think_time_s`` is the pause after the previous answer before the
turn is sent; ``output_tokens`` caps the answer. Read and checked before anything starts:
each mistake is one line naming the file, the line and the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import orjson

from loadgen.errors import ScenarioError
from loadgen.scenario.inputs import SESSIONS_MAX_BYTES, read_input

TURN_KEYS = frozenset({"user", "tool_results", "tool_calls", "think_time_s", "output_tokens"})
SESSION_KEYS = frozenset({"system", "turns", "id"})


@dataclass(frozen=True, slots=True)
class FileTurn:
    user: str | None = None
    tool_results: tuple[str, ...] = ()
    tool_calls: tuple[str, ...] | None = None  # the calls expected of the answer (None: not said)
    think_time_s: float | None = None
    output_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class FileSession:
    system: str | None
    turns: tuple[FileTurn, ...]


def _turn(raw: object, where: str) -> FileTurn:
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: a turn is an object such as {{\"user\": \"...\"}}")
    if unknown := sorted(set(raw) - TURN_KEYS):
        raise ScenarioError(f"{where}: unknown key {unknown[0]!r}; a turn has {', '.join(sorted(TURN_KEYS))}")
    user = raw.get("user")
    if user is not None and not isinstance(user, str):
        raise ScenarioError(f"{where}.user: give the user's message as text")
    results = raw.get("tool_results", [])
    if not isinstance(results, list):
        raise ScenarioError(f"{where}.tool_results: give a list of results, one per tool call")
    # a result given as JSON (an object) is sent as its JSON text
    texts = tuple(r if isinstance(r, str) else orjson.dumps(r).decode() for r in results)
    if user is None and not texts:
        raise ScenarioError(f"{where}: give user (a message) or tool_results (answers to the last tool calls)")
    calls = raw.get("tool_calls")
    if calls is not None and (not isinstance(calls, list) or not all(isinstance(c, str) and c for c in calls)):
        raise ScenarioError(f"{where}.tool_calls: give the names of the functions the answer should call")
    think = raw.get("think_time_s")
    if think is not None and (isinstance(think, bool) or not isinstance(think, int | float)
                              or not math.isfinite(think) or not 0 <= think <= 1e7):
        raise ScenarioError(f"{where}.think_time_s: give seconds, 0 or more")
    out = raw.get("output_tokens")
    if out is not None and (isinstance(out, bool) or not isinstance(out, int) or out < 1):
        raise ScenarioError(f"{where}.output_tokens: give a whole number of tokens, 1 or more")
    return FileTurn(user, texts, None if calls is None else tuple(calls), None if think is None else float(think), out)


def read_sessions(path: Path, functions: frozenset[str] | None = None) -> tuple[FileSession, ...]:
    """Every session of the file, checked; ``ScenarioError`` naming the line and field otherwise.
    With ``functions`` (the names workload.tools defines), a turn's expected calls must be among them."""
    lines = read_input(path, "session file", SESSIONS_MAX_BYTES).splitlines()
    sessions: list[FileSession] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            raw = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise ScenarioError(f"{where}: not JSON; give one session per line, "
                                "{\"system\": ..., \"turns\": [{\"user\": ...}, ...]}") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("turns"), list) or not raw["turns"]:
            raise ScenarioError(f"{where}: a session needs turns, a non-empty list such as [{{\"user\": \"...\"}}]")
        if unknown := sorted(set(raw) - SESSION_KEYS):
            raise ScenarioError(f"{where}: unknown key {unknown[0]!r}; a session has system, turns and id")
        system = raw.get("system")
        if system is not None and not isinstance(system, str):
            raise ScenarioError(f"{where}.system: give the system prompt as text")
        turns = tuple(_turn(t, f"{where}: turns[{i}]") for i, t in enumerate(raw["turns"]))
        for i, turn in enumerate(turns):
            unknown_calls = [c for c in turn.tool_calls or () if functions is not None and c not in functions]
            if unknown_calls:
                defined = ", ".join(sorted(functions or ())) or "none: the scenario gives no workload.tools"
                raise ScenarioError(f"{where}: turns[{i}].tool_calls: {unknown_calls[0]!r} is not a function of "
                                    f"workload.tools (defined: {defined})")
        if turns[0].user is None:
            raise ScenarioError(f"{where}: turns[0] needs user: a session opens with the user's message")
        sessions.append(FileSession(system, turns))
    if not sessions:
        raise ScenarioError(f"{path}: no session in the file; give one JSON session per line")
    return tuple(sessions)
