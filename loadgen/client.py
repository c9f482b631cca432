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
from typing import Any

import httpx

from loadgen.payload import ENDPOINTS, PreparedRequest, auth_headers
from loadgen.records import FailureClass, RequestRecord
from loadgen.scenario import Target
from loadgen.stream import Outcome, StreamState, error_snippet

__all__ = ["ConnectionPool", "PreparedRequest", "StreamingClient", "auth_headers"]


class _Trace:
    """httpcore's trace hook: ``sent_at`` is when the request starts onto the wire.

    Taken at "headers started", not "body complete": anyio yields to other tasks after a
    write, so under a burst the later event fires milliseconds after the server already
    has the request (measured TTFT then fell below the simulator's true TTFT).
    """

    __slots__ = ("st", "extensions")

    def __init__(self, st: StreamState) -> None:
        self.st = st
        self.extensions = {"trace": self.trace}

    async def trace(self, event: str, info: dict[str, Any]) -> None:
        if event == "http11.send_request_headers.started":
            self.st.sent_ns = time.perf_counter_ns()


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
        self._connect_s = target.timeouts.connect_s
        self._between_s = target.timeouts.between_tokens_s
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
        st = StreamState(self._first_token_s, self._total_s)
        trace = _Trace(st)
        error: FailureClass | None = None
        detail: str | None = None
        loop = asyncio.get_running_loop()
        limits = [t for t in (self._first_token_s, self._total_s) if t is not None]
        first_deadline = min(limits) if limits else None
        http = self._pool.acquire()
        try:
            async with asyncio.timeout(None) as scope:
                st.sent_ns = time.perf_counter_ns()  # replaced by the trace hook once written
                start_loop = loop.time()
                if first_deadline is not None:
                    scope.reschedule(start_loop + first_deadline)
                async with http.stream(
                    "POST", self._url, content=req.body, headers=self._headers,
                    extensions=trace.extensions,
                ) as resp:
                    st.status = resp.status_code
                    if resp.status_code >= 400:
                        body = await resp.aread()
                        error, detail = "http_status", error_snippet(body)
                    else:
                        error, detail = await self._read_stream(resp, st, scope, start_loop)
        except asyncio.CancelledError:
            emit(st.record(req, request_id, scheduled_ns, self._base, "cancelled", "run stopped"))
            raise
        except TimeoutError:
            error, detail = "timeout", "first token" if not st.chunk_ns else "total"
        except httpx.TimeoutException as exc:
            error = "timeout"
            if isinstance(exc, httpx.ConnectTimeout):
                detail = f"connect (no connection in {self._connect_s} s)"
            else:  # a read gap: between tokens, or from the response headers to the first token
                detail = f"no data for {self._between_s} s (between_tokens_s; {type(exc).__name__})"
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
        if error is not None and st.done_ns is None:
            st.done_ns = time.perf_counter_ns()  # when it was given up
        emit(st.record(req, request_id, scheduled_ns, self._base, error, detail))

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
        self, resp: httpx.Response, st: StreamState, scope: asyncio.Timeout, start_loop: float
    ) -> Outcome:
        now = time.perf_counter_ns
        total = self._total_s
        async for raw in resp.aiter_raw():
            had_token = bool(st.chunk_ns)
            if st.feed(raw, now()):
                if st.outcome != (None, None):
                    return st.end(0)  # a failure: stop reading, the connection is dropped
                # [DONE]: read the chunked terminator after it, so the connection is kept
            if not had_token and st.chunk_ns:
                # the first token is in: from now on only the total timeout applies
                scope.reschedule(start_loop + total if total is not None else None)
        return st.end(now())
