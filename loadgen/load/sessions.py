"""Multi-turn chat sessions: each turn sends the whole conversation so far, with the answers
the server actually gave, after the user's think time, on the connection the session holds.

``SessionRunner`` stands in for the client in the dispatcher: one ``send`` runs one session,
so the schedule starts sessions, the concurrency limit counts sessions in flight, and a stop
cancels them like requests (the turn in flight is recorded as cancelled). Turn ``t`` of
session ``s`` is request ``s * turns + t`` (``turns``: a session file's longest session's); a
generated user message is text of the cell's input length, unique like every prompt of the
run, so only the conversation's own history is shared with earlier requests: the part a
prefix cache is there to serve.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from loadgen.load.client import StreamingClient
from loadgen.results.records import RequestRecord
from loadgen.workload.payload import PreparedRequest
from loadgen.workload.sessions import Answer, Conversation, Turns


class SessionPool:
    """What the dispatcher hands the session runner for session i: a stand-in request saying
    only whether it is a warmup (each turn's body is made from the answers so far)."""

    def __init__(self, cell: int, count: int, warmup: bool = False) -> None:
        self.count = count
        self.marker = PreparedRequest(cell, b"", None, 0, warmup=warmup)

    def __getitem__(self, i: int) -> PreparedRequest:
        return self.marker

    def __len__(self) -> int:
        return self.count


class SessionRunner:
    """Runs whole sessions where the dispatcher sends requests."""

    def __init__(self, client: StreamingClient, turns: Turns) -> None:
        self.client = client
        self.turns = turns

    async def send(
        self, req: PreparedRequest, session: int, scheduled_ns: int, emit: Callable[[RequestRecord], None],
        slot_ns: int | None = None, free: Callable[[], None] | None = None,
    ) -> None:
        """Session ``session``: its turns one after another; it ends early at a failed turn (its
        concurrency slot is given back when it ends: ``free`` is the dispatcher's, not called here)."""
        talk = Conversation(self.turns, session)
        hold = self.client.holder()
        try:
            for t in range(talk.count):
                if (pause := talk.think_s(t)) > 0:
                    due = time.perf_counter_ns() + int(pause * 1e9)
                    await asyncio.sleep(pause)
                    while time.perf_counter_ns() < due:  # noqa: ASYNC110 - timers may fire a little early
                        await asyncio.sleep(0)
                    scheduled_ns = time.perf_counter_ns()  # the turn is due when the user is done thinking
                answer = Answer()
                seen: list[RequestRecord] = []

                def keep(r: RequestRecord, seen: list[RequestRecord] = seen) -> None:
                    seen.append(r)
                    emit(r)

                await self.client.send(
                    talk.request(t, req.warmup), session * self.turns.turns + t, scheduled_ns, keep,
                    slot_ns if t == 0 else None, answer=answer, hold=hold,
                )
                if not seen or not seen[-1].ok:
                    return
                talk.answered(answer)
                scheduled_ns = time.perf_counter_ns()  # (with no think time, the next turn is due now)
        finally:
            self.client.release(hold)
