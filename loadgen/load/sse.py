"""The one Server-Sent Events parser and chunk reader, for every endpoint and for the Locust user.

Works on bytes and splits only at line ends, so a network read may end anywhere: mid-line,
mid-field or in the middle of a multi-byte UTF-8 character. LF, CRLF and lone CR line ends
are all accepted, as the SSE specification requires.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

DONE = b"[DONE]"


# the largest event a stream may send (data lines together); a bigger one ends the request
MAX_EVENT_BYTES = 16 << 20


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
        if b"\n" not in chunk and b"\r" not in chunk and not self._buf.endswith(b"\r"):
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
        if b"\r" in buf:
            # hold back a trailing CR: it may be the first half of a CRLF split across reads
            keep_cr = buf.endswith(b"\r")
            if keep_cr:
                buf = buf[:-1]
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if keep_cr:
                buf += b"\r"
        events: list[bytes] = []
        start = 0
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


@dataclass(frozen=True, slots=True)
class Chunk:
    """What one SSE data payload says: text, cumulative usage, end of choice, error."""

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


def parse_chunk(data: bytes) -> Chunk:
    """Read a completions or chat chunk; raises ``MalformedChunk`` for anything else."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise MalformedChunk(f"not JSON: {data[:80]!r}") from exc
    if not isinstance(obj, dict):
        raise MalformedChunk(f"not a JSON object: {data[:80]!r}")
    if "error" in obj or obj.get("object") == "error":
        err = obj.get("error", obj)
        message = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        return Chunk("", False, None, None, None, str(message)[:300])
    text = ""
    reasoning = False
    finish = None
    choices = obj.get("choices")
    if choices is not None and not isinstance(choices, list):
        raise MalformedChunk(f"choices is not a list: {data[:80]!r}")
    if choices:
        choice = choices[0]
        if not isinstance(choice, dict):
            raise MalformedChunk(f"choice is not an object: {data[:80]!r}")
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text = _text(delta.get("content"), "delta.content", data)
            if not text:
                thought = delta.get("reasoning_content") or delta.get("reasoning")
                if isinstance(thought, str) and thought:
                    text, reasoning = thought, True
        elif delta is not None:
            raise MalformedChunk(f"delta is not an object: {data[:80]!r}")
        else:
            text = _text(choice.get("text"), "text", data)
        finish = choice.get("finish_reason")
        if finish is not None and not isinstance(finish, str):
            raise MalformedChunk(f"finish_reason is not text: {data[:80]!r}")
    elif choices is None and "usage" not in obj:
        raise MalformedChunk(f"neither choices nor usage: {data[:80]!r}")
    usage = obj.get("usage")
    completion = prompt = cached = None
    if isinstance(usage, dict):
        completion = usage.get("completion_tokens")
        prompt = usage.get("prompt_tokens")
        for name, value in (("completion_tokens", completion), ("prompt_tokens", prompt)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 <= value <= MAX_USAGE_TOKENS):
                raise InvalidUsage(f"usage.{name} is {value!r}")
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            cached = details["cached_tokens"]
    return Chunk(text, bool(choices), completion, prompt, finish, None, reasoning, cached)
