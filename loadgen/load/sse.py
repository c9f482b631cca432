"""The one Server-Sent Events parser and chunk reader, for every endpoint and for the Locust user.

Works on bytes and splits only at line ends, so a network read may end anywhere: mid-line,
mid-field or in the middle of a multi-byte UTF-8 character. LF, CRLF and lone CR line ends
are all accepted, as the SSE specification requires.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

DONE = b"[DONE]"


class SSEParser:
    """Incremental parser: ``feed(bytes)`` returns the ``data`` payloads of completed events."""

    __slots__ = ("_buf", "_data", "ignored_lines")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        # lines that are neither data, a known field nor a comment (e.g. JSON sent without "data:")
        self.ignored_lines = 0

    def feed(self, chunk: bytes) -> list[bytes]:
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
        return events

    def _line(self, line: bytes, events: list[bytes]) -> None:
        if not line:
            if self._data:
                events.append(b"\n".join(self._data))
                self._data = []
            return
        if line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(b" ") else value)
        elif line.startswith(b":"):
            return
        elif not line.startswith((b"event:", b"id:", b"retry:")):
            self.ignored_lines += 1

    def finish(self) -> list[bytes]:
        """End of stream: a last event that lacked its blank line is still returned."""
        events: list[bytes] = []
        if self._buf:
            self._line(self._buf.rstrip(b"\r"), events)
            self._buf = b""
        if self._data:
            events.append(b"\n".join(self._data))
            self._data = []
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
    if choices:
        choice = choices[0]
        if not isinstance(choice, dict):
            raise MalformedChunk(f"choice is not an object: {data[:80]!r}")
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text = delta.get("content") or ""
            if not text:
                thought = delta.get("reasoning_content") or delta.get("reasoning")
                if isinstance(thought, str) and thought:
                    text, reasoning = thought, True
        else:
            text = choice.get("text") or ""
        finish = choice.get("finish_reason")
    elif choices is None and "usage" not in obj:
        raise MalformedChunk(f"neither choices nor usage: {data[:80]!r}")
    usage = obj.get("usage")
    completion = prompt = cached = None
    if isinstance(usage, dict):
        completion = usage.get("completion_tokens")
        prompt = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            cached = details["cached_tokens"]
    return Chunk(text, bool(choices), completion, prompt, finish, None, reasoning, cached)
