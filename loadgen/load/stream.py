"""What one streamed request has received so far, and the record it becomes: no I/O here.

The asyncio client and the Locust user both feed the bytes they read (with the time they
read them) into a ``StreamState``; it parses SSE with the one parser, counts tokens per
chunk, classifies protocol failures and builds the ``RequestRecord``. Only the transport
and its timeouts differ between the two.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import orjson

from loadgen.load.sse import COMPILED, DONE, Chunk, EventTooLarge, InvalidUsage, MalformedChunk, SSEParser, parse_chunk
from loadgen.results.records import FailureClass, RequestRecord, TokenSource
from loadgen.scenario.shapes import MAX_TOKENS
from loadgen.scenario.target import token_limit
from loadgen.workload.payload import PreparedRequest
from loadgen.workload.sessions import Answer
from loadgen.workload.structured import valid_json

Outcome = tuple[FailureClass | None, str | None]


# a Responses API stream ends with its final event (response.completed), never with [DONE] or a
# chat chunk's finish_reason alone: such an answer is another API's, whatever its figures
NOT_RESPONSES = ("the answer ended as a chat completions stream does, without the Responses API's "
                 "response.completed: is this endpoint the Responses API? (target.api responses)")


class StreamState:
    """Mutable state of one request in flight; ``sent_ns`` / chunk times are perf_counter_ns."""

    __slots__ = (
        "sent_ns", "chunk_ns", "chunk_tokens", "cum_tokens", "usage_completion",
        "prompt_tokens", "finish_reason", "done_ns", "status", "parser", "outcome",
        "first_limit_ns", "total_limit_ns", "first_answer_ns", "reasoning_tokens", "cached_tokens", "answer",
        "token_limit", "retries", "final", "first_tool_call_ns", "tool_call_tokens", "whole", "embeddings",
        "client_delay_ns", "coalesced", "streamed", "inputs", "responses",
    )

    def __init__(
        self, first_token_s: float | None = None, total_s: float | None = None, max_tokens: int | None = None,
    ) -> None:
        """``first_token_s`` / ``total_s``: deadlines checked against each chunk's arrival time
        as well, so a chunk that lands while a busy client's timer is still pending is classed
        by when it came, not by which event the loop happened to run first."""
        limits = [x for x in (first_token_s, total_s) if x is not None]
        self.first_limit_ns = int(min(limits) * 1e9) if limits else None
        self.total_limit_ns = int(total_s * 1e9) if total_s is not None else None
        self.sent_ns = 0
        self.chunk_ns: list[int] = []
        self.chunk_tokens: list[int] = []
        self.streamed = 0  # sum(chunk_tokens), kept as they come
        self.cum_tokens = 0
        self.usage_completion: int | None = None
        self.prompt_tokens: int | None = None
        self.finish_reason: str | None = None
        self.done_ns: int | None = None
        self.status: int | None = None
        self.parser = SSEParser()
        # set once the stream is decided: (None, None) at [DONE], else the failure
        self.outcome: Outcome | None = None
        self.first_answer_ns: int | None = None
        self.reasoning_tokens = 0
        self.cached_tokens: int | None = None
        # the answer (text, tool calls, response id), kept only when asked for (a multi-turn
        # session sends it back; a structured answer is checked)
        self.answer: Answer | None = None
        # more output tokens than this (max_tokens and a margin for servers that count an end
        # token or two) no request can have: a usage beyond it is invalid, a stream beyond it overruns
        self.token_limit = token_limit(max_tokens)
        self.retries = 0  # sent again on a new connection: the kept-alive one was closed unanswered
        self.final = False  # the Responses API's last event came (its streams end without [DONE])
        self.first_tool_call_ns: int | None = None  # a tool call's first token
        self.tool_call_tokens = 0
        # an answer that is one JSON body (embeddings), not a stream: its bytes, read at its end
        self.whole: bytearray | None = None
        self.embeddings = 0
        self.inputs = 0  # the texts an embeddings request sent: as many vectors must come back
        self.responses = False  # asked of the Responses API: its stream must end with its final event
        # kernel-stamped reads: the longest the client took to handle one after it arrived (-1: none)
        self.client_delay_ns = -1
        self.coalesced = 0  # reads that carried more than one token-bearing event (they share a time)

    def feed(self, raw: bytes, t: int) -> bool:
        """Bytes read from the body at ``t``; True once the stream is decided (more bytes
        after that are only drained so the connection can be kept)."""
        if self.outcome is not None:
            return True
        if self.whole is not None:
            self.whole += raw
            return False
        try:
            events = self.parser.feed(raw)
        except EventTooLarge as exc:
            events = []
            self.done_ns = t
            self.outcome = ("malformed", str(exc))
        for data in events:
            if self._event(data, t):
                return True
        return self.outcome is not None

    def take(self, items: list[Chunk | None], t: int) -> bool | None:
        """The events of one read, each read whole by the compiled reading (a Chunk, None for
        [DONE]), as ``feed`` would take them; None where they must go through ``feed`` instead
        (the stream is decided, read whole, or its SSE parser holds part of an event)."""
        if self.outcome is not None or self.whole is not None or not self.parser.idle():
            return None
        for chunk in items:
            if self._decided(t) if chunk is None else self._chunk(chunk, t):
                return True
        return False

    def end(self, t: int) -> Outcome:
        """The body ended at ``t``: the stream's outcome."""
        if self.outcome is not None:
            return self.outcome
        if self.whole is not None:
            self.done_ns = t
            self.outcome = self._embeddings()
            return self.outcome
        for data in self.parser.finish():
            if self._event(data, t):
                return self.outcome  # type: ignore[return-value]
        self.done_ns = t
        if self.finish_reason is not None and self.responses and not self.final:
            return "malformed", NOT_RESPONSES
        if self.finish_reason is not None:
            return None, None  # a complete stream whose server omits [DONE]
        if self.parser.ignored_lines:
            return "malformed", f"{self.parser.ignored_lines} lines without an SSE field"
        return "stream_cut", "stream ended before finish_reason or [DONE]"

    def _embeddings(self) -> Outcome:
        """An embeddings answer read whole: its vectors and usage."""
        try:
            answer = orjson.loads(bytes(self.whole or b""))
        except orjson.JSONDecodeError:
            return "malformed", "the embeddings answer is not JSON"
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list) or not data:
            return "malformed", "the embeddings answer holds no data"
        if self.inputs and len(data) != self.inputs:
            return "malformed", f"the embeddings answer holds {len(data)} vectors for {self.inputs} inputs"
        if not all(isinstance(d, dict) and isinstance(v := d.get("embedding"), list | str) and v for d in data):
            return "malformed", "an item of the embeddings answer has no embedding (a list of numbers, or base64)"
        self.embeddings = len(data)
        usage = answer.get("usage")
        prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if prompt is not None and (isinstance(prompt, bool) or not isinstance(prompt, int)
                                   or not 0 <= prompt <= MAX_TOKENS * max(self.inputs, 1)):
            return "usage_invalid", f"usage.prompt_tokens is {prompt!r}, not a count of the inputs' tokens"
        self.prompt_tokens = prompt
        return None, None

    def _event(self, data: bytes, t: int) -> bool:
        if data == DONE:
            return self._decided(t)
        try:
            chunk = parse_chunk(data)
        except InvalidUsage as exc:
            return self._failed(("usage_invalid", str(exc)), t)
        except MalformedChunk as exc:
            return self._failed(("malformed", str(exc)), t)
        return self._chunk(chunk, t)

    def _decided(self, t: int) -> bool:
        """[DONE] at ``t``."""
        self.done_ns = t
        if self.responses and not self.final:
            self.outcome = ("malformed", NOT_RESPONSES)
        elif not self.chunk_ns and self.parser.ignored_lines:
            # [DONE] after lines that were not SSE fields (e.g. JSON without "data:")
            self.outcome = ("malformed", f"{self.parser.ignored_lines} lines without an SSE field")
        else:
            self.outcome = (None, None)
        return True

    def _failed(self, failure: tuple[FailureClass, str], t: int) -> bool:
        self.done_ns = t
        self.outcome = failure
        return True

    def _chunk(self, chunk: Chunk, t: int) -> bool:
        """One event's chunk at ``t``; True once the stream is decided."""
        failure = self._on_chunk(chunk, t)
        if failure is not None:
            return self._failed(failure, t)
        if self.final:
            self.done_ns = t
            self.outcome = (None, None)
            return True
        return False

    def _on_chunk(self, chunk: Chunk, t: int) -> tuple[FailureClass, str] | None:
        # (one unpacking: this runs once per token, and each named field read is a lookup; what it
        # does with a plain token is done a second time in compiled code, ``take_tokens``: a change
        # here is a change there, and tests/unit/load/test_whole_events.py fails until both agree)
        text, has_choices, completion, prompt, finish, error, reasoning, cached, final, tool, calls, rid = chunk
        if error is not None:
            return "stream_error", error
        if prompt is not None:
            self.prompt_tokens = prompt
        if completion is not None:
            if self.token_limit is not None and completion > self.token_limit:
                return "usage_invalid", (f"usage.completion_tokens is {completion}, beyond "
                                         f"what max_tokens allows ({self.token_limit} with its margin)")
            self.usage_completion = completion
        if cached is not None:
            self.cached_tokens = cached
        if final:
            self.final, self.finish_reason = True, finish
        answer = self.answer
        if answer is not None and (calls or rid):
            for index, id_, name, args in calls:
                answer.call(index, id_, name, args)
            answer.response_id = rid or answer.response_id
        if not has_choices:
            return None  # the final usage chunk, or a keep-alive
        chunk_ns = self.chunk_ns
        if completion is not None and (self.cum_tokens > 0 or not chunk_ns):
            # cumulative usage on every chunk: the exact number of tokens this chunk carried
            n = completion - self.cum_tokens
            if n == 0 and text:  # usage a chunk behind the text it counts: the text is a token
                n = 1
                self.cum_tokens += 1
            else:
                self.cum_tokens = completion
        else:
            # no usage so far (or only a total on the last chunk, as llama.cpp sends it):
            # one token per chunk with text; a role-only chat delta carries none
            n = 1 if text else 0
        if n > 0:
            if self.token_limit is not None and self.streamed + n > self.token_limit:
                return "overrun", (f"over {self.token_limit} tokens streamed, more than max_tokens allows "
                                   "with its margin: the stream was ended")
            waited = t - self.sent_ns
            if not chunk_ns and self.first_limit_ns is not None and waited > self.first_limit_ns:
                return "timeout", "first token"
            if self.total_limit_ns is not None and waited > self.total_limit_ns:
                return "timeout", "total"
            chunk_ns.append(t)
            self.chunk_tokens.append(n)
            self.streamed += n
            if reasoning:
                self.reasoning_tokens += n
            elif self.first_answer_ns is None:
                self.first_answer_ns = t
            if tool:
                self.tool_call_tokens += n
                if self.first_tool_call_ns is None:
                    self.first_tool_call_ns = t
        if answer is not None and text and not reasoning and not tool:
            answer.text.append(text)
        if finish is not None:
            self.finish_reason = finish
        return None

    def record(
        self,
        req: PreparedRequest,
        request_id: int,
        scheduled_ns: int,
        base_ns: int,
        error: FailureClass | None,
        detail: str | None,
        worker: int = 0,
        slot_ns: int | None = None,
    ) -> RequestRecord:
        """The request's record, times in seconds after ``base_ns`` (``slot_ns``: when its
        concurrency slot was free)."""
        sent = self.sent_ns
        chunk_total = self.streamed
        source: TokenSource = "usage" if self.usage_completion is not None else "chunks"
        # the server's count where it sent one (per chunk or at the end), else what arrived
        output = self.usage_completion if self.usage_completion is not None else chunk_total
        return RequestRecord(
            request_id=request_id,
            cell=req.cell,
            warmup=req.warmup,
            scheduled_at=(scheduled_ns - base_ns) / 1e9,
            sent_at=(sent - base_ns) / 1e9 if sent else None,
            first_token_at=(self.chunk_ns[0] - base_ns) / 1e9 if self.chunk_ns else None,
            last_token_at=(self.chunk_ns[-1] - base_ns) / 1e9 if self.chunk_ns else None,
            done_at=(self.done_ns - base_ns) / 1e9 if self.done_ns is not None else None,
            input_tokens=req.input_tokens,
            max_tokens=req.max_tokens,
            prompt_tokens=self.prompt_tokens,
            output_tokens=output,
            token_count_source=source,
            chunk_tokens_total=chunk_total,
            chunk_offsets_s=tuple([(c - sent) / 1e9 for c in self.chunk_ns]),  # (a list is made faster)
            chunk_tokens=tuple(self.chunk_tokens),
            status=self.status,
            error=error,
            error_detail=detail,
            worker=worker,
            slot_wait_s=max(slot_ns - scheduled_ns, 0) / 1e9 if slot_ns is not None else 0.0,
            first_answer_at=(self.first_answer_ns - base_ns) / 1e9 if self.first_answer_ns is not None else None,
            reasoning_tokens=self.reasoning_tokens,
            cached_tokens=self.cached_tokens,
            turn=req.turn,
            retries=self.retries,
            first_tool_call_at=None if self.first_tool_call_ns is None else (self.first_tool_call_ns - base_ns) / 1e9,
            tool_call_tokens=self.tool_call_tokens,
            image_bytes=req.image_bytes,
            embeddings=self.embeddings,
            client_delay_s=self.client_delay_ns / 1e9 if self.client_delay_ns >= 0 else None,
            coalesced_reads=self.coalesced,
            # a structured answer checked once it is whole (a failed request is not judged)
            valid_json=(valid_json("".join(self.answer.text if self.answer else ()), req.structured)
                        if req.structured is not None and error is None else None),
            # a session file's turn: its answer called the functions the file expected
            expected_tool_call=(self.answer.made(req.expect_calls) if self.answer is not None
                                and req.expect_calls is not None and error is None else None),
        )


def _not_taken(data: bytes, st: StreamState, t: int) -> bool:
    return False


# ``take_tokens(read, state, t)``: a read of whole events that are all plain tokens (a choice with no
# finish_reason, nothing of the answer kept, no usage past the stream's limit, no deadline passed) taken
# into the state at once in compiled code, as ``take`` takes their Chunks: True; False (the state
# untouched) where the read must go through ``take`` or the parsers, and always where the compiled
# reading is not there. tests/unit/load/test_whole_events.py holds the two to the same states.
take_tokens: Callable[[bytes, StreamState, int], bool] = (
    COMPILED.tokens(StreamState, SSEParser) if COMPILED is not None else _not_taken)


def error_snippet(body: bytes) -> str:
    """An error body on one line, at most 300 characters; an HTML page reduced to its text."""
    text = body[:4000].decode("utf-8", "replace")
    if text.lstrip().startswith("<"):
        text = re.sub(r"<(script|style)\b.*?</\1>|<[^>]+>", " ", text, flags=re.S | re.I)
    text = " ".join(text.split())[:300]
    return text or "(empty body)"
