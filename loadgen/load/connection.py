"""One keep-alive HTTP/1.1 connection of the streaming client: an asyncio ``Protocol`` with the
httptools response parser; a chunk is handled inside the loop's read callback (one clock reading,
the parser, the SSE scan), and the exchange's future is set once the stream is decided."""

from __future__ import annotations

import asyncio
import select
import socket
import time
from dataclasses import dataclass, field
from typing import cast

import httptools

from loadgen.load.sse import whole_events
from loadgen.load.stream import Outcome, StreamState, error_snippet, take_tokens
from loadgen.results.records import FailureClass

# test hook: busy-wait this many milliseconds per read, to starve the client on purpose
STARVE_ENV = "LOADGEN_TEST_CHUNK_DELAY_MS"
# a kept-alive connection the server closed within this long after its answer: the server
# closes after every answer (an idle timeout closes after seconds, not at once)
CLOSE_HABIT_NS = 1_000_000_000
# what a run says once it learned that habit
CLOSES_AFTER_ANSWER = (
    "the server closes its connections after each answer ({why}): every request from here on opens a new "
    "connection, and its TTFT includes the connect, as it does for every client of this server"
)


class _Closed:
    """The parser of a closed connection: whatever still arrives is not an answer."""

    def feed_data(self, data: bytes) -> None:
        raise httptools.HttpParserError("the connection is closed")

    def should_keep_alive(self) -> bool:
        return False

    def get_status_code(self) -> int:
        return 0


_NO_PARSER = cast(httptools.HttpResponseParser, _Closed())


@dataclass(slots=True)
class ClientStats:
    """What the read path cost: reads handled and the time spent handling them."""

    reads: int = 0
    read_ns: int = 0
    retries: int = 0  # requests sent again on a new connection (the kept-alive one was closed)
    # kernel-stamped reads: each read's client delay (handled minus arrived, ns), taken by the
    # self-check every interval
    delays: list[int] = field(default_factory=list)


class Exchange:
    """One request on a connection: what the protocol callbacks fill in, and its end."""

    __slots__ = ("st", "done", "body", "collect", "last_ns", "answered")

    def __init__(self, st: StreamState, done: asyncio.Future[Outcome], collect: bool = False) -> None:
        self.st = st
        self.done = done
        self.body: list[bytes] | None = None  # collected when the status is >= 400, or always
        self.collect = collect  # a plain (non-stream) exchange: the body is read whole
        self.last_ns = 0
        self.answered = False  # a byte of the answer arrived


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection carrying one request at a time."""

    def __init__(self, stats: ClientStats, starve_s: float) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False
        self.ex: Exchange | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._stats = stats
        self._t = 0
        self._until_close = False
        self._html = False  # the answer says it is a web page, not an event stream
        self._body: list[bytes] = []  # this read's pieces of the stream, fed once the read is parsed
        self._starve_s = starve_s
        self.answered_ns = 0  # when its last answer ended (0: none yet)
        self.closed_cleanly = False
        # a chunked event stream whose HTTP parser stands between two chunks: a read of whole
        # chunks of one whole event each may then be read by the compiled reading alone
        self._chunked = False
        self._fast = False  # the answer is such a stream (its headers said so) and the compiled reading is built
        self._between = False  # the parser's last step was a chunk's end (or the headers' end)
        self._boundary = False  # ... and the last read ended there
        self._interim = False  # the answer being parsed is an interim one (103 Early Hints); the real one follows

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter_ns()
        self._read(data, t, t)

    def stamped(self, data: bytes, arrived: int, handled: int) -> None:
        """Bytes the kernel received at ``arrived`` (a ``StampedTransport``'s read), handled now."""
        delay = handled - arrived
        self._stats.delays.append(delay)
        ex = self.ex
        if ex is not None and delay > ex.st.client_delay_ns:
            ex.st.client_delay_ns = delay
        self._read(data, arrived, handled)

    def _read(self, data: bytes, t: int, handled: int) -> None:
        """One read: ``t`` is when its bytes arrived (the kernel's stamp, or the loop's clock)."""
        ex = self.ex
        if ex is not None and t < ex.last_ns:
            # stamped before the read ahead of it (two reads' kernel stamps out of order by a few
            # microseconds): no byte of a stream arrives before those ahead of it, nor an ITL below 0
            t = ex.last_ns
        self._t = t
        if ex is not None:
            ex.last_ns = t
            ex.answered = True
            before = len(ex.st.chunk_ns)
        if ex is None or not self._boundary or not (take_tokens(data, ex.st, t) or self._whole(ex, data)):
            try:
                self._parser.feed_data(data)
            except httptools.HttpParserError as exc:
                self._feed()
                self._fail("reset" if self.ex is None or self.ex.st.status is None else "stream_cut",
                           f"invalid HTTP response: {exc}")
            else:
                self._feed()
            self._boundary = self._between and data.endswith(b"\r\n")
        if ex is not None and len(ex.st.chunk_ns) - before > 1:
            ex.st.coalesced += 1  # several tokens in one read: they share its time
        if self._starve_s:
            end = time.perf_counter() + self._starve_s
            while time.perf_counter() < end:
                pass
        stats = self._stats
        stats.reads += 1
        stats.read_ns += time.perf_counter_ns() - handled

    def _whole(self, ex: Exchange, data: bytes) -> bool:
        """A read of whole chunks, each one whole event, read by the compiled reading alone (the
        HTTP parser, between two chunks, is left there); False where it is not one."""
        assert whole_events is not None
        items = whole_events(data)
        if items is None:
            return False
        st = ex.st
        decided = st.take(items, self._t)
        if decided is None:
            return False
        if decided and st.outcome != (None, None) and not ex.done.done():
            assert st.outcome is not None
            ex.done.set_result(st.outcome)
            self.abort()
        return True

    def eof_received(self) -> bool | None:
        self.closed_cleanly = True  # the server closed it (FIN), rather than resetting it
        return None  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        # the parser holds this protocol's methods: without the cycle a closed connection is freed
        # at once (a server that closes after each answer would otherwise leave one for the
        # cyclic collector per request)
        self._parser = _NO_PARSER
        ex = self.ex
        if ex is None or ex.done.done():
            return
        st = ex.st
        if st.status is None:
            detail = f"{type(exc).__name__}: {exc}" if exc else "server closed the connection before responding"
            ex.done.set_result(("reset", detail))
        elif self._until_close and exc is None:
            self._finish(st.end(time.perf_counter_ns()))  # a body delimited by the close
        elif st.outcome == (None, None):
            ex.done.set_result((None, None))  # [DONE] arrived; only the terminator was lost
        else:
            detail = f"{type(exc).__name__}: {exc}" if exc else "server closed the connection mid-body"
            ex.done.set_result(("stream_cut", detail))

    # httptools callbacks
    def on_headers_complete(self) -> None:
        ex = self.ex
        if ex is None:
            return
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # an interim answer (100 Continue, 103 Early Hints)
            self._interim = True
            return
        ex.st.status = status
        # a stream is a 200 of events: an error status, another 2xx (204 No Content...) or a
        # web page (a proxy's or a login page) is read whole and classed, never parsed as SSE
        if status >= 400 or ex.collect or status != 200 or self._html:
            ex.body = []
        else:
            self._fast = self._between = self._chunked and whole_events is not None

    def on_chunk_header(self) -> None:
        self._between = False

    def on_chunk_complete(self) -> None:
        self._between = self._fast

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"transfer-encoding" or lower == b"content-length":
            self._until_close = False
            self._chunked = lower == b"transfer-encoding" and value.lower().strip() == b"chunked"
        elif lower == b"content-type" and value.lower().startswith(b"text/html"):
            self._html = True

    def on_body(self, body: bytes) -> None:
        ex = self.ex
        if ex is None:
            return
        if ex.body is not None:
            ex.body.append(body)
            return
        self._body.append(body)

    def _feed(self) -> None:
        """The read's pieces of the stream (an HTTP chunk each: one per token, where TCP merged
        several) to its parser at once."""
        pieces = self._body
        ex = self.ex
        if not pieces or ex is None:
            return
        st = ex.st
        body = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        pieces.clear()
        if st.feed(body, self._t) and st.outcome != (None, None) and not ex.done.done():
            # a failure decided mid-stream: stop reading, the connection is dropped
            assert st.outcome is not None
            ex.done.set_result(st.outcome)
            self.abort()

    def on_message_complete(self) -> None:
        if self._interim:  # its headers said nothing of the answer that follows
            self._interim = self._html = self._chunked = False
            self._until_close = True
            return
        self._feed()
        ex = self.ex
        self.reusable = self._parser.should_keep_alive()  # Connection: close (or HTTP/1.0) is honoured
        self.answered_ns = self._t
        if ex is None or ex.done.done():
            return
        status = ex.st.status or 0
        if ex.body is not None and status >= 400:
            ex.done.set_result(("http_status", error_snippet(b"".join(ex.body))))
        elif ex.body is not None and not ex.collect and status != 200:
            ex.done.set_result(("http_status", f"HTTP {status} where a stream was expected"))
        elif ex.body is not None and not ex.collect:
            ex.done.set_result(("malformed", "a web page (text/html) where an event stream was expected"))
        elif ex.body is not None:
            ex.done.set_result((None, None))
        else:
            self._finish(ex.st.end(self._t))

    # the client's side
    def begin(self, ex: Exchange, request: bytes) -> None:
        self.ex = ex
        self.reusable = False
        self._until_close = True  # until a length or chunked encoding says otherwise
        self._html = False
        self._chunked = self._fast = self._between = self._boundary = self._interim = False
        self._parser = httptools.HttpResponseParser(self)
        assert self.transport is not None
        ex.st.sent_ns = ex.last_ns = time.perf_counter_ns()
        self.transport.write(request)

    def _finish(self, outcome: Outcome) -> None:
        ex = self.ex
        if ex is not None and not ex.done.done():
            ex.done.set_result(outcome)

    def _fail(self, error: FailureClass, detail: str) -> None:
        ex = self.ex
        if ex is not None and not ex.done.done():
            ex.done.set_result((error, detail))
        self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def readable(conn: Connection) -> bool:
    """True when an idle connection has something to read (the server's EOF, most likely) or is
    already closed, its loss not yet handed to the protocol: either way it is not to be reused."""
    transport = conn.transport
    if transport is None:
        return False
    if transport.is_closing():
        return True
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    if sock.fileno() < 0:
        return True
    poll = select.poll()
    poll.register(sock.fileno(), select.POLLIN | select.POLLRDHUP)
    return bool(poll.poll(0))
