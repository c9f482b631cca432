"""The async streaming client: one ``RequestRecord`` per request, never an exception.

Every network or protocol failure is classified and stored on the record with the partial
data received so far (tokens before a cut are kept). Only cancellation propagates, after
the in-flight request has been recorded as ``cancelled``.

The request path is an asyncio ``Protocol`` per keep-alive HTTP/1.1 connection with the
httptools response parser (the parser uvicorn uses). A chunk is handled inside the loop's
read callback: one clock reading, the parser, the SSE scan; no task wakes per chunk. The
coroutine that sent the request sleeps until the stream is decided. This replaced httpx on
the hot path. Measured with ``benchmarks/client_capacity.py`` (client on one core, 256-token
streams at 100 tokens/s): at 512 streams httpx sustained 82% of the ideal tokens/s with TTFT
p99 +459 ms and ITL p99 +237 ms off the truth; this path 98.5% with +0.2 ms and +0.9 ms, and
96% of ideal at 1,024 streams (``--client httpx`` re-measures the former).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from urllib.parse import urlsplit

import httpx
import orjson

from loadgen import __version__
from loadgen.data import Unchecked
from loadgen.errors import UsageError
from loadgen.load.connection import CLOSE_HABIT_NS, STARVE_ENV, ClientStats, Connection, Exchange, readable
from loadgen.load.limits import CLIENT_ERRNOS
from loadgen.load.recording import Recorder
from loadgen.load.sidecall import side_call, side_client
from loadgen.load.stamped import StampedPoller, kernel_clock_problem, open_stamped
from loadgen.load.stream import Outcome, StreamState
from loadgen.results.records import FailureClass, RequestRecord
from loadgen.scenario.target import Target, default_total_s
from loadgen.scenario.wire import redact_url, split_userinfo
from loadgen.workload.payload import ENDPOINTS, PreparedRequest, auth_headers, with_basic_auth
from loadgen.workload.sessions import Answer

__all__ = ["ClientStats", "PreparedRequest", "StreamingClient", "auth_headers"]

@dataclass(frozen=True, slots=True)
class ClientConfig:
    """What a client is built from, in this process or in a worker process: the target, its URL
    and key, the run's clock base, and whether every request opens its own connection."""

    target: Target
    base_url: str
    clock_base_ns: int
    api_key: str | None = None
    new_connection_per_request: bool = False
    clock: str = "auto"  # load.clock: auto, kernel or loop


def new_loop() -> asyncio.AbstractEventLoop:
    """The client's event loop: uvloop's where it is installed (Linux and macOS)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class StreamingClient:
    """Sends prepared requests to ``{base_url}/completions`` or ``/chat/completions``.

    Connections are kept alive and reused, one per concurrent stream; ``open_connections``
    opens them ahead of a measured window. With ``new_connection_per_request`` every request
    opens its own connection, and TTFT includes the connection setup.
    """

    def __init__(self, config: ClientConfig, *, worker: int = 0) -> None:
        self.config = config  # what a worker process builds the same client from
        target, base_url, api_key = config.target, config.base_url, config.api_key
        self._worker = worker
        url = base_url.rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{redact_url(base_url)}: not an http(s) URL")
        self._host = parts.hostname
        self._tls = parts.scheme == "https"
        self._port = parts.port or (443 if self._tls else 80)
        self._ssl: ssl.SSLContext | None = None
        self._verify = target.verify_tls
        self._id_prefix = target.request_id_prefix
        self._models_url = url + "/models"
        self._models_path = (parts.path or "") + "/models"
        # user:password in the URL: basic auth, as curl sends it (the URL itself is used without them)
        self._headers = with_basic_auth(auth_headers(target, api_key), split_userinfo(base_url)[1])
        self._path = (parts.path or "") + ENDPOINTS[target.api]
        host_header = parts.netloc.rsplit("@", 1)[-1]
        lines = [
            f"POST {self._path} HTTP/1.1", f"Host: {host_header}",
            f"User-Agent: loadgen/{__version__}", "Accept: text/event-stream",
            *(f"{k}: {v}" for k, v in self._headers.items()),
        ]
        self._head = ("\r\n".join(lines) + "\r\nContent-Length: ").encode("latin-1")
        t = target.timeouts
        self._first_token_s = t.first_token_s
        self._connect_s = t.connect_s
        self._between_s = t.between_tokens_s
        self._total_s = t.total_s
        self._base = config.clock_base_ns
        self._fresh = config.new_connection_per_request
        # why the server is not sent kept-alive connections (learned from its habit), once known
        self.learned_close: str | None = None
        self._free: list[Connection] = []
        self._recorder: Recorder | None = None  # made at the first request, on its loop
        self._all: set[Connection] = set()
        self.stats = ClientStats()
        self._starve_s = float(os.environ.get(STARVE_ENV) or 0) / 1e3
        # which clock times the answers' bytes, and why not the kernel's where it is not
        problem = kernel_clock_problem(self._tls)
        if config.clock == "kernel" and problem is not None:
            raise UsageError(f"load.clock kernel: {problem}; set load.clock: auto (or loop)")
        self.clock_note = "load.clock: loop" if config.clock == "loop" else problem
        self.clock = "loop" if self.clock_note is not None else "kernel"
        self._poller: StampedPoller | None = None  # the stamped sockets' epoll set, made on first use

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for conn in list(self._all):
            if conn.transport is not None:
                conn.transport.close()
        self._all.clear()
        self._free.clear()
        await asyncio.sleep(0)
        if self._poller is not None:
            self._poller.close()
            self._poller = None

    async def fetch_models(self) -> Unchecked:
        """``GET {base_url}/models``, bounded; raises ``httpx.HTTPError`` or ``ValueError``."""
        async with side_client(verify=self._verify) as http:
            status, body = await side_call(http, "GET", self._models_url, what="the model list", headers=self._headers)
        if status >= 400:
            raise ValueError(f"HTTP {status} {body[:200].decode(errors='replace')}")
        data = orjson.loads(body)
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise ValueError("not an OpenAI /models answer")
        return data

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        if self._tls and self._ssl is None:
            self._ssl = httpx.create_ssl_context(verify=self._verify)
        async with asyncio.timeout(self._connect_s):
            if self.clock == "kernel":
                if self._poller is None or self._poller.loop is not loop:
                    self._poller = StampedPoller(loop)
                conn = Connection(self.stats, self._starve_s)
                await open_stamped(self._poller, self._host, self._port, conn)
            else:
                _, conn = await loop.create_connection(
                    lambda: Connection(self.stats, self._starve_s), self._host, self._port,
                    ssl=self._ssl if self._tls else None,
                )
        self._all.add(conn)
        return conn

    def _idle(self) -> Connection | None:
        """A kept-alive connection to reuse; one the server has closed (or sent anything on)
        while idle is dropped, as httpcore does, instead of failing the next request. A server
        that closed it right after its answer has the close-after-answer habit: learned."""
        while self._free:
            conn = self._free.pop()
            if not conn.closed and not readable(conn):
                return conn
            if conn.answered_ns and time.perf_counter_ns() - conn.answered_ns < CLOSE_HABIT_NS:
                self._learn("it closed a kept-alive connection right after its answer")
            conn.abort()
            self._all.discard(conn)
        return None

    def _learn(self, why: str) -> None:
        """Stop reusing connections to a server that closes them after each answer (llama.cpp
        does, while its headers offer keep-alive): from now on every request opens its own, and
        its TTFT includes the connect, as it does for every real client of that server."""
        if self.learned_close is None:
            self.learned_close = why
        self._fresh = True
        for conn in self._free:
            conn.close()
            self._all.discard(conn)
        self._free.clear()

    async def _open(self, st: StreamState) -> tuple[Connection | None, FailureClass | None, str | None]:
        """A new connection, or the failure to get one (its setup counts in TTFT)."""
        st.sent_ns = time.perf_counter_ns()
        try:
            return await self._connect(), None, None
        except TimeoutError:
            return None, "timeout", f"connect (no connection in {self._connect_s} s)"
        except OSError as exc:
            # out of descriptors or buffers is the client's own failure, not the server's
            return None, "client" if exc.errno in CLIENT_ERRNOS else "connect", str(exc) or type(exc).__name__

    def _put_back(self, conn: Connection) -> None:
        conn.ex = None
        if conn.closed or not conn.reusable or self._fresh:
            conn.close()
            self._all.discard(conn)
        else:
            self._free.append(conn)

    @staticmethod
    def holder() -> list[Connection | None]:
        """An empty holder for ``send(hold=...)``: the connection a session keeps between turns."""
        return [None]

    def release(self, hold: list[Connection | None]) -> None:
        """A held connection back to the pool (the end of a session)."""
        if hold and hold[0] is not None:
            conn, hold[0] = hold[0], None
            self._put_back(conn)

    async def open_connections(self, count: int) -> None:
        """Have ``count`` idle keep-alive connections ready before the measured window, so
        TTFT holds no connection setup (nothing to do with ``new_connection_per_request``)."""
        if self._fresh:
            return
        live = [c for c in self._free if not c.closed]
        self._free[:] = live
        missing = count - len(live)
        if missing <= 0:
            return

        loop = asyncio.get_running_loop()
        get = (f"GET {self._models_path} HTTP/1.1\r\n".encode() + self._head.split(b"\r\n", 1)[1]
               .removesuffix(b"Content-Length: ").replace(b"Accept: text/event-stream", b"Accept: */*") + b"\r\n")

        async def one() -> None:
            # connect, then one GET /models round trip: the server has accepted the connection
            # and set it up before the window, not during the first measured request
            try:
                conn = await self._connect()
            except (OSError, TimeoutError):
                return  # the measured requests will record what is wrong
            ex = Exchange(StreamState(), loop.create_future(), collect=True)
            conn.begin(ex, get)
            try:
                async with asyncio.timeout(self._between_s):
                    await ex.done
            except TimeoutError:
                conn.abort()
            self._put_back(conn)

        await asyncio.gather(*(one() for _ in range(missing)))

    async def send(
        self,
        req: PreparedRequest,
        request_id: int,
        scheduled_ns: int,
        emit: Callable[[RequestRecord], None],
        slot_ns: int | None = None,
        answer: Answer | None = None,
        hold: list[Connection | None] | None = None,
        free: Callable[[], None] | None = None,
    ) -> None:
        """Send one request and ``emit`` its record (also when cancelled, before re-raising);
        ``slot_ns``: when a concurrency slot became free for it; ``answer``: gathers the
        answer's text and tool calls as they stream (a multi-turn session sends them back);
        ``hold``: a one-element list that keeps the connection between the calls that share
        it (a session's turns), given back to the pool by ``release``; ``free``: gives its
        concurrency slot back, called as soon as the exchange ended."""
        total = self._total_s if self._total_s is not None else default_total_s(req.max_tokens)
        st = StreamState(self._first_token_s, total, req.max_tokens)
        st.answer = answer if answer is not None or req.structured is None else Answer()  # kept to be checked
        st.whole = bytearray() if req.embeddings else None  # an embeddings answer: one JSON body
        st.inputs = req.embeddings
        st.responses = self._path.endswith(ENDPOINTS["responses"])
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Outcome] = loop.create_future()
        ex = Exchange(st, done)
        conn: Connection | None = None
        error: FailureClass | None = None
        detail: str | None = None
        timers: list[asyncio.TimerHandle] = []
        head = self._head
        if self._id_prefix is not None:  # the line goes before Content-Length, which ends the head
            name = f"{request_id}" if request_id >= 0 else f"warmup{-request_id}"  # warmups count down from -1
            head = head.replace(b"\r\nContent-Length: ",
                                f"\r\nX-Request-Id: {self._id_prefix}{name}\r\nContent-Length: ".encode(), 1)
        payload = head + b"%d\r\n\r\n" % len(req.body) + req.body
        try:
            if hold is not None and hold[0] is not None:
                kept, hold[0] = hold[0], None
                if not kept.closed and not readable(kept):
                    conn = kept
                else:
                    kept.abort()
                    self._all.discard(kept)
            if conn is None:
                conn = self._idle()
            reused = conn is not None
            if conn is None:
                conn, error, detail = await self._open(st)  # a new connection: setup counts in TTFT
            if conn is not None:
                sent = st.sent_ns
                conn.begin(ex, payload)
                if sent:
                    st.sent_ns = sent
                timers = self._arm(loop, conn, ex, total)
                error, detail = await done
                if error == "reset" and reused and not ex.answered:
                    # a kept-alive connection the server closed before any byte of the answer:
                    # the request never reached it (a POST without an answer is safe to resend).
                    # Sent again on a new connection, once; its times stay the first attempt's
                    if conn.closed_cleanly and conn.answered_ns and st.sent_ns - conn.answered_ns < CLOSE_HABIT_NS:
                        # closed (not reset) right after its last answer: the server's habit, not an
                        # idle timeout or a server that reset one connection
                        self._learn("it closed a kept-alive connection before answering")
                    first = st.sent_ns
                    disarm(timers)
                    conn.abort()
                    self._all.discard(conn)
                    st.retries += 1
                    self.stats.retries += 1
                    done = loop.create_future()
                    ex = Exchange(st, done)
                    conn, error, detail = await self._open(st)
                    st.sent_ns = first
                    if conn is not None:
                        conn.begin(ex, payload)
                        st.sent_ns = first
                        timers = self._arm(loop, conn, ex, total)
                        error, detail = await done
        except asyncio.CancelledError:
            if conn is not None:
                conn.abort()
            emit(st.record(
                req, request_id, scheduled_ns, self._base, "cancelled", "run stopped", self._worker, slot_ns,
            ))
            raise
        finally:
            disarm(timers)
            if conn is not None:
                if error is not None:
                    conn.abort()  # a failed exchange leaves the connection in an unknown state
                if hold is not None and error is None and not conn.closed and conn.reusable and not self._fresh:
                    conn.ex = None
                    hold[0] = conn
                else:
                    self._put_back(conn)
        if error is not None and st.done_ns is None:
            st.done_ns = time.perf_counter_ns()  # when it was given up
        make = partial(_emit_record, emit, st, req, request_id, scheduled_ns, self._base, error, detail,
                       self._worker, slot_ns)
        if free is None:
            make()
            return
        # the slot first, the record at its turn (recording.py): the next request's send never waits
        # behind the records of every request that ended with this one
        free()
        if self._recorder is None or self._recorder.loop is not loop:
            self._recorder = Recorder(loop)
        await self._recorder.record(make)

    def _arm(
        self, loop: asyncio.AbstractEventLoop, conn: Connection, ex: Exchange, total: float,
    ) -> list[asyncio.TimerHandle]:
        """Timers for the deadlines (see ``Deadlines``); ``disarm`` cancels them."""
        return Deadlines(loop, conn, ex, self._first_token_s, total, self._between_s).handles


def _emit_record(
    emit: Callable[[RequestRecord], None], st: StreamState, req: PreparedRequest, request_id: int, scheduled_ns: int,
    base_ns: int, error: FailureClass | None, detail: str | None, worker: int, slot_ns: int | None,
) -> None:
    emit(st.record(req, request_id, scheduled_ns, base_ns, error, detail, worker, slot_ns))


def disarm(timers: list[asyncio.TimerHandle]) -> None:
    """Cancel a request's deadline timers and drop them: each timer's callback holds the list that
    holds the timer, a cycle that would keep the request's whole state (its parser, its token
    times) for the cyclic collector, whose scans of that much young garbage stall the loop."""
    for h in timers:
        h.cancel()
    timers.clear()


class Deadlines:
    """A request's deadlines: first token / total from ``sent_at``, and the gap (re-armed lazily):
    to complete headers, then between bytes until the first token (keep-alives while a server
    queues count), then between tokens (comments alone keep no stream alive). A class, not
    closures: a closure that re-arms itself is a reference cycle, and so would keep the whole
    request for the cyclic collector; the one cycle here (timer, method, ``handles``) is broken
    by ``disarm``."""

    __slots__ = ("loop", "conn", "ex", "first", "total", "between", "start", "handles")

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: Connection, ex: Exchange, first: float | None,
                 total: float | None, between: float | None) -> None:
        self.loop, self.conn, self.ex = loop, conn, ex
        self.first, self.total, self.between = first, total, between
        self.start = loop.time()
        self.handles: list[asyncio.TimerHandle] = []
        limits = [x for x in (first, total) if x is not None]
        if limits:
            self.handles.append(loop.call_later(min(limits), self.deadline))
        if between is not None:
            self.handles.append(loop.call_later(between, self.gap))

    def deadline(self) -> None:
        ex, first, total = self.ex, self.first, self.total
        if ex.done.done():
            return
        if not ex.st.chunk_ns:
            self.conn._fail("timeout", "first token" if first is not None and (total is None or first <= total)
                            else "total")
        elif total is not None:
            left = self.start + total - self.loop.time()
            if left > 0:
                self.handles.append(self.loop.call_later(left, self.deadline))
            else:
                self.conn._fail("timeout", "total")

    def gap(self) -> None:
        ex, st, between = self.ex, self.ex.st, self.between
        assert between is not None
        if ex.done.done():
            return
        if st.status is None:
            since, what = st.sent_ns, f"response headers not complete in {between} s (between_tokens_s)"
        elif st.chunk_ns:
            since, what = st.chunk_ns[-1], f"no token for {between} s (between_tokens_s)"
        else:
            since, what = ex.last_ns, f"no data for {between} s (between_tokens_s)"
        idle = (time.perf_counter_ns() - since) / 1e9
        if idle >= between:
            self.conn._fail("timeout", what)
        else:
            self.handles.append(self.loop.call_later(between - idle, self.gap))
