"""The one Server-Sent Events parser and chunk reader, for every endpoint and for the Locust user.

Works on bytes and splits only at line ends, so a network read may end anywhere: mid-line,
mid-field or in the middle of a multi-byte UTF-8 character. LF, CRLF and lone CR line ends
are all accepted, as the SSE specification requires.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import NamedTuple

import orjson

DONE = b"[DONE]"


# the largest event a stream may send (data lines together); a bigger one ends the request
MAX_EVENT_BYTES = 16 << 20

# line ends as byte values: ``LF in data`` is a byte search, where ``b"\n" in data`` first tries
# the operand as an integer and builds (then drops) a TypeError, per read (141 against 18 ns)
LF, CR = 0x0A, 0x0D


class EventTooLarge(ValueError):
    """One event (or one line still without its end) grew past ``MAX_EVENT_BYTES``."""


# no request produces more tokens than this: a larger count in usage is not believed
MAX_USAGE_TOKENS = 1 << 30


class SSEParser:
    """Incremental parser: ``feed(bytes)`` returns the ``data`` payloads of completed events.

    Reads that end no line are kept as a list and joined once their line ends, so a long line
    costs time linear in its length; an event over ``max_event_bytes`` raises ``EventTooLarge``.
    """

    __slots__ = ("_buf", "_data", "_data_bytes", "_parts", "_parts_bytes", "ignored_lines", "max_event_bytes")

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._buf = b""
        self._parts: list[bytes] = []  # reads of a line not ended yet
        self._parts_bytes = 0
        self._data: list[bytes] = []
        self._data_bytes = 0
        self.max_event_bytes = max_event_bytes
        # lines that are neither data, a known field nor a comment (e.g. JSON sent without "data:")
        self.ignored_lines = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        if (not self._buf and chunk.startswith(b"data: ") and chunk.find(b"\n", 6) == len(chunk) - 2
                and chunk.endswith(b"\n\n") and CR not in chunk and not self._parts and not self._data
                and len(chunk) <= self.max_event_bytes):
            # what a server sends a token at a time: one whole event of one "data: " line, taken
            # in a step (half the cost of the general reading below, once per token)
            return [chunk[6:-2]]
        if LF not in chunk and CR not in chunk and not self._buf.endswith(b"\r"):
            # the line goes on: keep the read, join once the line ends
            if self._buf:
                self._parts.append(self._buf)
                self._parts_bytes += len(self._buf)
                self._buf = b""
            self._parts.append(chunk)
            self._parts_bytes += len(chunk)
            if self._parts_bytes + self._data_bytes > self.max_event_bytes:
                raise EventTooLarge(f"an event of over {self.max_event_bytes >> 20} MiB")
            return []
        if self._parts:
            chunk = b"".join([*self._parts, self._buf, chunk])
            self._parts, self._parts_bytes, self._buf = [], 0, b""
        buf = self._buf + chunk if self._buf else chunk
        if CR in buf:
            # hold back a trailing CR: it may be the first half of a CRLF split across reads
            keep_cr = buf.endswith(b"\r")
            if keep_cr:
                buf = buf[:-1]
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if keep_cr:
                buf += b"\r"
        events: list[bytes] = []
        start = 0
        if not self._data:
            # what servers send: events of one "data: " line each, taken whole without a call
            # per line; the first event of another shape goes to the line-by-line reading below
            parts = buf.split(b"\n\n")
            parts.pop()  # what follows the last blank line (an event not ended yet)
            for part in parts:
                if part.startswith(b"data: ") and LF not in part and len(part) <= self.max_event_bytes:
                    events.append(part[6:])
                elif part:
                    break
                start += len(part) + 2
        find = buf.find
        while True:
            end = find(b"\n", start)
            if end < 0:
                break
            self._line(buf[start:end], events)
            start = end + 1
        self._buf = buf[start:]
        if len(self._buf) + self._data_bytes > self.max_event_bytes:
            raise EventTooLarge(f"an event of over {self.max_event_bytes >> 20} MiB")
        return events

    def idle(self) -> bool:
        """Nothing of an event held: the next byte begins one."""
        return not self._buf and not self._parts and not self._data

    def _line(self, line: bytes, events: list[bytes]) -> None:
        if not line:
            if self._data:
                events.append(b"\n".join(self._data))
                self._data, self._data_bytes = [], 0
            return
        if line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(b" ") else value)
            self._data_bytes += len(value)
            if self._data_bytes > self.max_event_bytes:
                raise EventTooLarge(f"an event of over {self.max_event_bytes >> 20} MiB")
        elif line.startswith(b":"):
            return
        elif not line.startswith((b"event:", b"id:", b"retry:")):
            self.ignored_lines += 1

    def finish(self) -> list[bytes]:
        """End of stream: a last event that lacked its blank line is still returned."""
        events: list[bytes] = []
        if self._parts:
            self._buf = b"".join([*self._parts, self._buf])
            self._parts, self._parts_bytes = [], 0
        if self._buf:
            self._line(self._buf.rstrip(b"\r"), events)
            self._buf = b""
        if self._data:
            events.append(b"\n".join(self._data))
            self._data, self._data_bytes = [], 0
        return events


class Chunk(NamedTuple):
    """What one SSE data payload says: text, cumulative usage, end of choice, error. (A named
    tuple: one is made per token, and a tuple is made at a fraction of a frozen dataclass's cost.)"""

    text: str
    has_choices: bool
    completion_tokens: int | None
    prompt_tokens: int | None
    finish_reason: str | None
    error: str | None
    # the text is a reasoning model's thinking (delta.reasoning_content / delta.reasoning)
    reasoning: bool = False
    # usage.prompt_tokens_details.cached_tokens: prompt tokens the server served from its cache
    cached_tokens: int | None = None
    # the stream's last event (the Responses API's response.completed: it sends no [DONE])
    final: bool = False
    # the text is a tool call's (delta.tool_calls: the function's name and its arguments)
    tool_call: bool = False
    # the pieces of tool calls it carried: (index, id, name, arguments), for a session's history
    calls: tuple[tuple[int, str, str, str], ...] = ()
    # the Responses API's id of the response (a session's next turn may name it)
    response_id: str | None = None


class MalformedChunk(ValueError):
    pass


class InvalidUsage(MalformedChunk):
    """Usage with impossible token counts (negative, not an integer, beyond any request)."""


def _text(value: object, name: str, data: bytes) -> str:
    """A chunk's text field: text, or nothing; a number or an object there is malformed."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedChunk(f"{name} is not text: {data[:80]!r}")
    return value


def _usage(usage: object, completion_key: str, prompt_key: str, details_key: str) -> tuple[int | None, ...]:
    """(completion, prompt, cached) tokens of a usage object, checked."""
    if type(usage) is not dict:
        return None, None, None
    completion, prompt = usage.get(completion_key), usage.get(prompt_key)
    # (the checks written out: this runs once per token where usage comes with every chunk)
    if completion is not None and not (type(completion) is int and 0 <= completion <= MAX_USAGE_TOKENS):
        raise InvalidUsage(f"usage.{completion_key} is {completion!r}")
    if prompt is not None and not (type(prompt) is int and 0 <= prompt <= MAX_USAGE_TOKENS):
        raise InvalidUsage(f"usage.{prompt_key} is {prompt!r}")
    details = usage.get(details_key)
    cached = details.get("cached_tokens") if type(details) is dict else None
    return completion, prompt, cached if type(cached) is int else None


# the Responses API's events that carry text: the answer, and a reasoning model's thinking
ANSWER_DELTA = "response.output_text.delta"
REASONING_DELTAS = ("response.reasoning_text.delta", "response.reasoning_summary_text.delta",
                    "response.reasoning.delta")
FINAL_EVENTS = ("response.completed", "response.incomplete")
CALL_DELTA = "response.function_call_arguments.delta"


def _response_event(kind: str, obj: dict[str, object], data: bytes) -> Chunk:
    """One event of a Responses API stream (``{"type": "response...."}``). A function call's
    arguments are its tokens (its item, added with the first of them, names it)."""
    if kind == ANSWER_DELTA or kind in REASONING_DELTAS:
        return Chunk(_text(obj.get("delta"), "delta", data), True, None, None, None, None, kind != ANSWER_DELTA)
    index = obj.get("output_index")
    index = index if isinstance(index, int) else 0
    if kind == CALL_DELTA:
        delta = _text(obj.get("delta"), "delta", data)
        return Chunk(delta, True, None, None, None, None, tool_call=True, calls=((index, "", "", delta),))
    item = obj.get("item")
    if kind == "response.output_item.added" and isinstance(item, dict) and item.get("type") == "function_call":
        call = (index, str(item.get("call_id") or ""), str(item.get("name") or ""), str(item.get("arguments") or ""))
        return Chunk("", False, None, None, None, None, tool_call=True, calls=(call,))
    response = obj.get("response")
    response = response if isinstance(response, dict) else {}
    rid = response.get("id") if isinstance(response.get("id"), str) else None
    if kind in FINAL_EVENTS:
        completion, prompt, cached = _usage(response.get("usage"), "output_tokens", "input_tokens",
                                            "input_tokens_details")
        status = response.get("status")
        return Chunk("", False, completion, prompt, status if isinstance(status, str) else kind[9:], None,
                     cached_tokens=cached, final=True, response_id=rid)
    if kind == "response.failed":
        err = response.get("error")
        message = err.get("message", str(err)) if isinstance(err, dict) else "response.failed"
        return Chunk("", False, None, None, None, str(message)[:300])
    # created (with the response's id), in_progress, item and part events: no token
    return Chunk("", False, None, None, None, None, response_id=rid)


def read_chunk(data: bytes) -> Chunk:
    """Read a completions or chat chunk, or a Responses API event; raises ``MalformedChunk``
    for anything else. (Called once per token where the compiled reading is missing or passes
    the chunk on: the common chunk takes the fewest steps.)"""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise MalformedChunk(f"not JSON: {data[:80]!r}") from exc
    if type(obj) is not dict:
        raise MalformedChunk(f"not a JSON object: {data[:80]!r}")
    if "type" in obj:
        kind = obj["type"]
        if isinstance(kind, str) and kind.startswith("response."):
            return _response_event(kind, obj, data)
    if "error" in obj or obj.get("object") == "error":
        err = obj.get("error", obj)
        message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        return Chunk("", False, None, None, None, str(message)[:300])
    text: object = ""
    reasoning = tool = False
    finish = None
    pieces: tuple[tuple[int, str, str, str], ...] = ()
    choices = obj.get("choices")
    if choices is not None and type(choices) is not list:
        raise MalformedChunk(f"choices is not a list: {data[:80]!r}")
    if choices:
        choice = choices[0]
        if type(choice) is not dict:
            raise MalformedChunk(f"choice is not an object: {data[:80]!r}")
        delta = choice.get("delta")
        if delta is None:
            text = choice.get("text")
            if type(text) is not str:
                text = _text(text, "text", data)
        elif type(delta) is dict:
            text = delta.get("content")
            if type(text) is not str:
                text = _text(text, "delta.content", data)
            if not text:
                thought = delta.get("reasoning_content") or delta.get("reasoning")
                if isinstance(thought, str) and thought:
                    text, reasoning = thought, True
            if not text and (calls := delta.get("tool_calls")):
                pieces = _tool_pieces(calls, data)
                text, tool = "".join(name + args for _, _, name, args in pieces), True
        else:
            raise MalformedChunk(f"delta is not an object: {data[:80]!r}")
        finish = choice.get("finish_reason")
        if finish is not None and type(finish) is not str:
            raise MalformedChunk(f"finish_reason is not text: {data[:80]!r}")
    elif choices is None and "usage" not in obj:
        raise MalformedChunk(f"neither choices nor usage: {data[:80]!r}")
    usage = obj.get("usage")
    completion = prompt = cached = None
    if usage is not None:
        completion, prompt, cached = _usage(usage, "completion_tokens", "prompt_tokens", "prompt_tokens_details")
    # (the tuple built directly: a named tuple's own constructor is a Python call, 4 times slower)
    return _new_chunk(Chunk, (text, bool(choices), completion, prompt, finish, None, reasoning, cached, False, tool,
                              pieces, None))


_new_chunk = tuple.__new__


def _tool_pieces(calls: object, data: bytes) -> tuple[tuple[int, str, str, str], ...]:
    """A tool-call delta's pieces: each call's index, id and function name (on its first delta)
    and arguments."""
    if not isinstance(calls, list):
        raise MalformedChunk(f"delta.tool_calls is not a list: {data[:80]!r}")
    pieces = []
    for n, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            index = call.get("index")
            pieces.append((index if isinstance(index, int) else n, _text(call.get("id"), "id", data),
                           _text(function.get("name"), "function.name", data),
                           _text(function.get("arguments"), "function.arguments", data)))
    return tuple(pieces)


# set to "python": the Python reading alone (chunks and sockets), even where the compiled one was built
CHUNK_READER_ENV = "LOADGEN_CHUNK_READER"


WholeEvents = Callable[[bytes], "list[Chunk | None] | None"]


def _compiled_module() -> ModuleType | None:
    """``_chunkscan.c``, built at install where a C compiler is found; None where it was not
    built or is set aside."""
    if os.environ.get(CHUNK_READER_ENV) == "python":
        return None
    try:
        from loadgen.load import _chunkscan
    except ImportError:
        return None
    return _chunkscan


# the compiled reading's module (its ``drain`` reads the kernel clock's sockets: stamped.py)
COMPILED = _compiled_module()
# ``parse_chunk``, the common chunk read straight from its bytes and every other one passed to
# ``read_chunk``, and ``whole_events``
_compiled = (COMPILED.configure(Chunk, read_chunk), COMPILED.events) if COMPILED is not None else None
# one chunk's reading, once per token: compiled where built (about 1.5 us a token less), else Python
parse_chunk: Callable[[bytes], Chunk] = _compiled[0] if _compiled else read_chunk
# a read of whole HTTP chunks of one whole "data: " event each, read at once: its Chunks (None for
# [DONE]), or None where the read is otherwise; None where the compiled reading is not there
whole_events: WholeEvents | None = _compiled[1] if _compiled else None
CHUNK_READER = "compiled" if _compiled is not None else "python"
