"""A multi-turn session's conversation, the same for every client that runs sessions (loadgen's
asyncio client and the Locust user).

Generated sessions: the system prompt, each turn's user message (generated text of the turn's
input length, unique in the run), and each turn's request, the whole conversation so far with
the answers the server gave. Sessions from a file (agent sessions): the file's system prompt,
user messages and tool results, the answers (text and tool calls) the server gave, and each
turn's own think time and output cap.

Tool calls: an answer's calls are kept in the history as the server made them; the next turn
answers each (its tool results in turn, or an empty result where the file gives none, so the
conversation stays one every server takes). Where the file gives results but the answer made
no call, the results are sent as the user's message. On the Responses API with ``history:
previous-response``, a turn sends only what is new since the last answer, with that answer's id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadgen.scenario.sessionfile import FileSession, FileTurn
from loadgen.workload.payload import Api, PreparedRequest, Prompt, encode_payload
from loadgen.workload.prompts import RequestMaker

Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Turns:
    maker: RequestMaker
    turns: int  # generated sessions' turns; for a file, its longest session's (request ids)
    think_time_s: float
    system_tokens: int = 0
    sessions: tuple[FileSession, ...] = ()  # sessions from a file, used in turn
    history: str = "full"  # or "previous-response": only what is new, with previous_response_id

    def count(self, session: int) -> int:
        """Session ``session``'s turns."""
        return len(self.sessions[session % len(self.sessions)].turns) if self.sessions else self.turns

    def planned(self, sessions: int) -> int:
        """The requests ``sessions`` sessions send when every turn is answered."""
        if not self.sessions:
            return sessions * self.turns
        whole, part = divmod(sessions, len(self.sessions))
        return whole * sum(len(s.turns) for s in self.sessions) + sum(len(s.turns) for s in self.sessions[:part])


def turns_of(maker: RequestMaker) -> Turns:
    """The sessions of ``maker``'s workload (a session file's as read before the run)."""
    mt = maker.prompts.workload.multi_turn
    assert mt is not None  # only a workload with sessions runs them
    longest = max((len(s.turns) for s in maker.sessions), default=0)
    return Turns(maker, mt.turns or longest, mt.think_time_s, mt.system_tokens, maker.sessions, mt.history)


@dataclass(slots=True)
class Answer:
    """What a turn's answer gave back, gathered as it streams: its text, its tool calls (by
    index: id, name, arguments) and, on the Responses API, its id."""

    text: list[str] = field(default_factory=list)
    calls: dict[int, list[str]] = field(default_factory=dict)
    response_id: str | None = None

    def call(self, index: int, id_: str, name: str, arguments: str) -> None:
        """A piece of tool call ``index``: its id and name (once), its arguments (appended)."""
        held = self.calls.setdefault(index, ["", "", ""])
        held[0] = held[0] or id_
        held[1] = held[1] or name
        held[2] += arguments

    @property
    def tool_calls(self) -> list[tuple[str, str, str]]:
        """(id, name, arguments) of each call, in order."""
        return [tuple(self.calls[i]) for i in sorted(self.calls)]  # type: ignore[misc]

    def made(self, expected: tuple[str, ...]) -> bool:
        """Whether the answer called exactly the functions expected (in any order)."""
        return sorted(name for _, name, _ in self.tool_calls) == sorted(expected)


class Conversation:
    """One session as it goes: ``request(t)`` makes turn ``t`` (after the previous answer was
    given to ``answered``)."""

    def __init__(self, turns: Turns, session: int) -> None:
        self.turns, self.session = turns, session
        self.file = turns.sessions[session % len(turns.sessions)] if turns.sessions else None
        self.count = turns.count(session)
        self.history: list[Message] = self._opening()
        self.pending: list[tuple[str, str, str]] = []  # the last answer's tool calls, not answered yet
        self.previous: str | None = None  # the last answer's response id
        self.held = 0  # history the server holds already (previous-response: not sent again)

    def _opening(self) -> list[Message]:
        """The history before the first turn: the system prompt, if any. Generated content is drawn
        per (session, slot): slots 0..k-1 the turns, slot k the system prompt."""
        if self.file is not None:
            return [] if self.file.system is None else [{"role": "system", "content": self.file.system}]
        m, k = self.turns.maker, self.turns.turns
        if not self.turns.system_tokens:
            return []
        per_word = m.prompts.calibration.per_word  # a message's content is sized without the template's tokens
        words = max(1, round(self.turns.system_tokens / per_word))
        return [{"role": "system", "content": m.prompts.text(words, m.cell, m.stream, self.session * (k + 1) + k)}]

    def think_s(self, t: int) -> float:
        """The pause before turn ``t`` (after the previous answer); none before the first."""
        if t == 0:
            return 0.0
        own = self.file.turns[t].think_time_s if self.file is not None else None
        return self.turns.think_time_s if own is None else own

    def request(self, t: int, warmup: bool = False) -> PreparedRequest:
        """Turn ``t``'s request: the conversation so far and the turn's own messages."""
        m = self.turns.maker
        turn = self.file.turns[t] if self.file is not None else None
        if turn is None:
            slot = self.session * (self.turns.turns + 1) + t
            inp, out = m.lengths(slot)
            words = max(1, round(inp / m.prompts.calibration.per_word))
            self._answer_calls(())
            self.history.append({"role": "user", "content": m.prompts.text(words, m.cell, m.stream, slot)})
            size: int | None = inp
        else:
            out, size = turn.output_tokens or m.output_tokens, None
            self._file_turn(turn)
        api: Api = "responses" if m.target.api == "responses" else "chat"
        previous = self.turns.history == "previous-response" and self.previous is not None
        body = m.body(Prompt(None, messages=tuple(self.history[self.held:] if previous else self.history)), out, api)
        if self.turns.history == "previous-response":
            body["store"] = True  # the server keeps the answer for the next turn to name
            if previous:
                body["previous_response_id"] = self.previous
        expect = turn.tool_calls if turn is not None else None
        return PreparedRequest(m.cell, encode_payload(body), size, out, warmup=warmup, turn=t, expect_calls=expect)

    def _file_turn(self, turn: FileTurn) -> None:
        if self.pending or not turn.tool_results:
            self._answer_calls(turn.tool_results)
        else:  # results with no call to answer: the user's message carries them
            self.history.append({"role": "user", "content": "\n".join(turn.tool_results)})
        if turn.user is not None:
            self.history.append({"role": "user", "content": turn.user})

    def _answer_calls(self, results: tuple[str, ...]) -> None:
        """A tool message for each call of the last answer: the results in turn, else empty."""
        for i, (id_, _, _) in enumerate(self.pending):
            self.history.append({"role": "tool", "tool_call_id": id_, "content": results[i % len(results)]
                                 if results else ""})
        self.pending = []

    def answered(self, answer: Answer) -> None:
        """The turn's answer, kept in the history as the server gave it."""
        message: Message = {"role": "assistant", "content": "".join(answer.text)}
        if calls := answer.tool_calls:
            message["tool_calls"] = [{"id": id_, "type": "function", "function": {"name": name, "arguments": args}}
                                     for id_, name, args in calls]
        self.history.append(message)
        self.pending, self.previous = calls, answer.response_id
        self.held = len(self.history)
