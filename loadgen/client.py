"""The async streaming client: one ``RequestRecord`` per request, never an exception.

Every network or protocol failure is classified and stored on the record with the partial
data received so far (tokens before a cut are kept). Only cancellation propagates, after
the in-flight request has been recorded as ``cancelled``.
"""

from __future__ import annotations

import asyncio
import ssl
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


class ConnectionPool:
    """One keep-alive connection per concurrent stream, handed out from a free list.

    httpx's shared pool scans every connection for every queued request: at 64 streams that
    was 4.8 million ``is_idle`` calls for 2,072 requests and cost 40% of the throughput
    (benchmarks/client_overhead.py). Here each stream borrows a single-connection client,
    so a request finds its connection in O(1) and keeps it alive for the next one.
    """

    def __init__(self, target: Target) -> None:
        t = target.timeouts
        self._timeout = httpx.Timeout(
            connect=t.connect_s, read=t.between_tokens_s, write=t.between_tokens_s, pool=None
        )
        self._free: list[httpx.AsyncClient] = []
        self._all: list[httpx.AsyncClient] = []
        # one TLS context for all streams: httpx builds one per client otherwise (25 ms each)
        self._ssl: ssl.SSLContext | None = None

    def acquire(self) -> httpx.AsyncClient:
        if self._free:
            return self._free.pop()
        # trust_env=False: a proxy from the environment would sit inside every measured latency
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context()
        http = httpx.AsyncClient(
            timeout=self._timeout, trust_env=False, verify=self._ssl,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        )
        self._all.append(http)
        return http

    def release(self, http: httpx.AsyncClient) -> None:
        self._free.append(http)

    async def aclose(self) -> None:
        await asyncio.gather(*(h.aclose() for h in self._all))
        self._all.clear()
        self._free.clear()


def auth_headers(target: Target, api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", **target.headers}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


class StreamingClient:
    """Sends prepared requests to ``{base_url}/completions`` or ``/chat/completions``."""

    def __init__(
        self,
        target: Target,
        base_url: str,
        *,
        clock_base_ns: int,
        api_key: str | None = None,
    ) -> None:
        self._pool = ConnectionPool(target)
        self._url = base_url.rstrip("/") + ENDPOINTS[target.api]
        self._models_url = base_url.rstrip("/") + "/models"
        self._headers = auth_headers(target, api_key)
        self._first_token_s = target.timeouts.first_token_s
        self._total_s = target.timeouts.total_s
        self._base = clock_base_ns

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._pool.aclose()

    async def fetch_models(self) -> dict[str, Any]:
        """``GET {base_url}/models``; raises ``httpx.HTTPError`` or ``ValueError``."""
        http = self._pool.acquire()
        try:
            resp = await http.get(self._models_url, headers=self._headers)
        finally:
            self._pool.release(http)
        resp.raise_for_status()
        data = resp.json()
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise ValueError("not an OpenAI /models answer")
        return data

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
        http = self._pool.acquire()
        try:
            async with asyncio.timeout(None) as scope:
                st.sent_ns = time.perf_counter_ns()  # replaced by the trace hook once written
                st.start_loop = loop.time()
                if first_deadline is not None:
                    scope.reschedule(st.start_loop + first_deadline)
                async with http.stream(
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
        finally:
            self._pool.release(http)  # after a failure httpcore has dropped the connection
        emit(self._record(req, request_id, scheduled_ns, st, error, detail))

    async def open_connections(self, count: int) -> None:
        """Open ``count`` keep-alive connections before the measured window (cheap GETs),
        so TTFT holds no connection setup."""
        clients = [self._pool.acquire() for _ in range(count)]

        async def one(http: httpx.AsyncClient) -> None:
            try:
                await http.get(self._models_url, headers=self._headers)
            except httpx.HTTPError:
                pass  # the measured requests will record what is wrong

        try:
            await asyncio.gather(*(one(h) for h in clients))
        finally:
            for h in clients:
                self._pool.release(h)

    async def _read_stream(
        self,
        resp: httpx.Response,
        st: _Stream,
        scope: asyncio.Timeout,
        loop: asyncio.AbstractEventLoop,
    ) -> tuple[FailureClass | None, str | None]:
        parser = SSEParser()
        now = time.perf_counter_ns
        result: tuple[FailureClass | None, str | None] | None = None
        async for raw in resp.aiter_raw():
            if result is not None:
                continue  # the chunked terminator after [DONE]: read it so the connection is kept
            t = now()
            for data in parser.feed(raw):
                if data == DONE:
                    st.done_ns = t
                    result = (None, None)
                    break
                failure = self._on_chunk(data, t, st, scope, loop)
                if failure is not None:
                    st.done_ns = t
                    return failure
        if result is not None:
            return result
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
