"""A multi-turn session's messages, the same for every client that runs sessions (loadgen's
asyncio client and the Locust user): the system prompt, each turn's user message (generated
text of the turn's input length, unique in the run), and each turn's request, the whole
conversation so far with the answers the server gave."""

from __future__ import annotations

from dataclasses import dataclass

from loadgen.workload.payload import Api, Prompt, encode_payload
from loadgen.workload.prompts import RequestMaker


@dataclass(frozen=True, slots=True)
class Turns:
    maker: RequestMaker
    turns: int
    think_time_s: float
    system_tokens: int = 0


def session_start(turns: Turns, session: int) -> list[dict[str, str]]:
    """Session ``session``'s history before its first turn: its system prompt, if any. Prompt
    content is drawn per (session, slot): slots 0..k-1 the turns, slot k the system prompt."""
    m, k = turns.maker, turns.turns
    if not turns.system_tokens:
        return []
    per_word = m.prompts.calibration.per_word  # a message's content is sized without the template's tokens
    words = max(1, round(turns.system_tokens / per_word))
    return [{"role": "system", "content": m.prompts.text(words, m.cell, m.stream, session * (k + 1) + k)}]


def next_message(turns: Turns, session: int, t: int, history: list[dict[str, str]]) -> int:
    """Turn ``t``'s user message appended to ``history``; returns the turn's output length."""
    m, k = turns.maker, turns.turns
    slot = session * (k + 1) + t
    inp, out = m.lengths(slot)
    per_word = m.prompts.calibration.per_word
    history.append({"role": "user", "content": m.prompts.text(max(1, round(inp / per_word)), m.cell, m.stream, slot)})
    return out


def turn_body(m: RequestMaker, history: list[dict[str, str]], max_tokens: int) -> bytes:
    """A turn's request: the whole conversation so far."""
    api: Api = "responses" if m.target.api == "responses" else "chat"
    return encode_payload(m.body(Prompt(None, messages=tuple(history)), max_tokens, api))


