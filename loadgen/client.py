"""The async streaming client: one ``RequestRecord`` per request, never an exception.

Every network or protocol failure is classified and stored on the record with the partial
data received so far (tokens before a cut are kept). Only cancellation propagates, after
the in-flight request has been recorded as ``cancelled``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from loadgen.payload import ENDPOINTS, MalformedChunk, parse_chunk
from loadgen.records import FailureClass, RequestRecord, TokenSource
from loadgen.scenario import Target
from loadgen.sse import DONE, SSEParser


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A request ready to send: its body is serialised before the measured window."""

    cell: int
    body: bytes
    input_tokens: int | None
    max_tokens: int
    warmup: bool = False


class _Stream:
    """Mutable state of one request in flight, turned into a record when it ends."""

    __slots__ = (
        "sent_ns", "chunk_ns", "chunk_tokens", "cum_tokens", "usage_completion",
        "prompt_tokens", "finish_reason", "done_ns", "status", "start_loop", "extensions",
    )

    def __init__(self) -> None:
        self.sent_ns = 0
        self.chunk_ns: list[int] = []
        self.chunk_tokens: list[int] = []
        self.cum_tokens = 0
        self.usage_completion: int | None = None
        self.prompt_tokens: int | None = None
        self.finish_reason: str | None = None
        self.done_ns: int | None = None
        self.status: int | None = None
        self.start_loop = 0.0
        self.extensions = {"trace": self.trace}

    async def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook: ``sent_at`` is when the request starts onto the wire.

        Taken at "headers started", not "body complete": anyio yields to other tasks after a
        write, so under a burst the later event fires milliseconds after the server already
        has the request (measured TTFT then fell below the simulator's true TTFT).
        """
        if event == "http11.send_request_headers.started":
            self.sent_ns = time.perf_counter_ns()


def build_http_client(target: Target, concurrency: int | None) -> httpx.AsyncClient:
    t = target.timeouts
    timeout = httpx.Timeout(
        connect=t.connect_s, read=t.between_tokens_s, write=t.between_tokens_s, pool=None
    )
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    # trust_env=False: a proxy from the environment would sit inside every measured latency
    return httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False)


def auth_headers(target: Target, api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", **target.headers}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


class StreamingClient:
    """Sends prepared requests to ``{base_url}/completions`` or ``/chat/completions``."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        target: Target,
        base_url: str,
        *,
        clock_base_ns: int,
        api_key: str | None = None,
    ) -> None:
        self._http = http
        self._url = base_url.rstrip("/") + ENDPOINTS[target.api]
        self._models_url = base_url.rstrip("/") + "/models"
        self._headers = auth_headers(target, api_key)
        self._first_token_s = target.timeouts.first_token_s
        self._total_s = target.timeouts.total_s
        self._base = clock_base_ns

    async def send(
        self,
        req: PreparedRequest,
        request_id: int,
        scheduled_ns: int,
        emit: Callable[[RequestRecord], None],
    ) -> None:
        """Send one request and ``emit`` its record (also when cancelled, before re-raising)."""
        st = _Stream()
        error: FailureClass | None = None
        detail: str | None = None
        loop = asyncio.get_running_loop()
        limits = [t for t in (self._first_token_s, self._total_s) if t is not None]
        first_deadline = min(limits) if limits else None
        try:
            async with asyncio.timeout(None) as scope:
                st.sent_ns = time.perf_counter_ns()  # replaced by the trace hook once written
                st.start_loop = loop.time()
                if first_deadline is not None:
                    scope.reschedule(st.start_loop + first_deadline)
                async with self._http.stream(
                    "POST", self._url, content=req.body, headers=self._headers,
                    extensions=st.extensions,
                ) as resp:
                    st.status = resp.status_code
                    if resp.status_code >= 400:
                        body = await resp.aread()
                        error, detail = "http_status", _snippet(body)
                    else:
                        error, detail = await self._read_stream(resp, st, scope, loop)
        except asyncio.CancelledError:
            emit(self._record(req, request_id, scheduled_ns, st, "cancelled", "run stopped"))
            raise
        except TimeoutError:
            error, detail = "timeout", "first token" if not st.chunk_ns else "total"
        except httpx.TimeoutException as exc:
            error, detail = "timeout", type(exc).__name__
        except httpx.ConnectError as exc:
            error, detail = "connect", str(exc) or type(exc).__name__
        except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
            error = "reset" if st.status is None else "stream_cut"
            detail = str(exc) or type(exc).__name__
        except httpx.HTTPError as exc:
            error = "connect" if st.status is None else "stream_cut"
            detail = f"{type(exc).__name__}: {exc}"
        emit(self._record(req, request_id, scheduled_ns, st, error, detail))

    async def open_connections(self, count: int) -> None:
        """Open ``count`` keep-alive connections before the measured window (cheap GETs).

        They serve the first request of each concurrency slot. A streamed request closes its
        connection at [DONE] (see ``_read_stream``), so later requests connect afresh; their
        ``sent_at`` is taken once the connection is open, so TTFT holds no connect time.
        """

        async def one() -> None:
            try:
                await self._http.get(self._models_url, headers=self._headers)
            except httpx.HTTPError:
                pass  # the measured requests will record what is wrong

        await asyncio.gather(*(one() for _ in range(count)))

    async def _read_stream(
        self,
        resp: httpx.Response,
        st: _Stream,
        scope: asyncio.Timeout,
        loop: asyncio.AbstractEventLoop,
    ) -> tuple[FailureClass | None, str | None]:
        parser = SSEParser()
        now = time.perf_counter_ns
        # Returning at [DONE] leaves the chunked terminator unread, so httpcore closes the
        # connection and the next request opens a new one (sent_at is taken after connect,
        # so TTFT holds no connect time). Draining to keep it alive measured slower: at 64
        # keep-alive connections httpcore's pool bookkeeping cost ~2 ms CPU per request.
        async for raw in resp.aiter_raw():
            t = now()
            for data in parser.feed(raw):
                if data == DONE:
                    st.done_ns = t
                    return None, None
                failure = self._on_chunk(data, t, st, scope, loop)
                if failure is not None:
                    st.done_ns = t
                    return failure
        t = now()
        for data in parser.finish():
            if data == DONE:
                st.done_ns = t
                return None, None
            failure = self._on_chunk(data, t, st, scope, loop)
            if failure is not None:
                return failure
        st.done_ns = t
        if st.finish_reason is not None:
            return None, None  # a complete stream whose server omits [DONE]
        if parser.ignored_lines:
            return "malformed", f"{parser.ignored_lines} lines without an SSE field"
        return "stream_cut", "stream ended before finish_reason or [DONE]"

    def _on_chunk(
        self,
        data: bytes,
        t: int,
        st: _Stream,
        scope: asyncio.Timeout,
        loop: asyncio.AbstractEventLoop,
    ) -> tuple[FailureClass, str] | None:
        try:
            chunk = parse_chunk(data)
        except MalformedChunk as exc:
            return "malformed", str(exc)
        if chunk.error is not None:
            return "stream_error", chunk.error
        if chunk.prompt_tokens is not None:
            st.prompt_tokens = chunk.prompt_tokens
        if chunk.completion_tokens is not None:
            st.usage_completion = chunk.completion_tokens
        if not chunk.has_choices:
            return None  # the final usage chunk, or a keep-alive
        if chunk.completion_tokens is not None:
            # cumulative usage on every chunk: the exact number of tokens this chunk carried
            n = chunk.completion_tokens - st.cum_tokens
            st.cum_tokens = chunk.completion_tokens
        else:
            n = 1 if chunk.text else 0  # a role-only chat delta carries none
        if n > 0:
            if not st.chunk_ns:
                total = self._total_s
                scope.reschedule(st.start_loop + total if total is not None else None)
            st.chunk_ns.append(t)
            st.chunk_tokens.append(n)
        if chunk.finish_reason is not None:
            st.finish_reason = chunk.finish_reason
        return None

    def _record(
        self,
        req: PreparedRequest,
        request_id: int,
        scheduled_ns: int,
        st: _Stream,
        error: FailureClass | None,
        detail: str | None,
    ) -> RequestRecord:
        base = self._base
        sent = st.sent_ns
        chunk_total = sum(st.chunk_tokens)
        source: TokenSource = "usage" if st.usage_completion is not None else "chunks"
        # the server's count where it sent one (per chunk or at the end), else what arrived
        output = st.usage_completion if st.usage_completion is not None else chunk_total
        return RequestRecord(
            request_id=request_id,
            cell=req.cell,
            warmup=req.warmup,
            scheduled_at=(scheduled_ns - base) / 1e9,
            sent_at=(sent - base) / 1e9 if sent else None,
            first_token_at=(st.chunk_ns[0] - base) / 1e9 if st.chunk_ns else None,
            last_token_at=(st.chunk_ns[-1] - base) / 1e9 if st.chunk_ns else None,
            done_at=(st.done_ns - base) / 1e9 if st.done_ns is not None else None,
            input_tokens=req.input_tokens,
            max_tokens=req.max_tokens,
            prompt_tokens=st.prompt_tokens,
            output_tokens=output,
            token_count_source=source,
            chunk_tokens_total=chunk_total,
            chunk_offsets_s=tuple((c - sent) / 1e9 for c in st.chunk_ns),
            chunk_tokens=tuple(st.chunk_tokens),
            status=st.status,
            error=error,
            error_detail=detail,
        )


def _snippet(body: bytes) -> str:
    text = body[:300].decode("utf-8", "replace").strip().replace("\n", " ")
    return text or "(empty body)"


async def fetch_models(
    http: httpx.AsyncClient, base_url: str, headers: dict[str, str]
) -> dict[str, Any]:
    """``GET {base_url}/models``; raises ``httpx.HTTPError`` or ``ValueError``."""
    resp = await http.get(base_url.rstrip("/") + "/models", headers=headers)
    resp.raise_for_status()
    data = resp.json()
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise ValueError("not an OpenAI /models answer")
    return data
