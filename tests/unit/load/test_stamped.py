"""The kernel-stamped transport on its own, against a plain TCP server on loopback: a body far
larger than the socket's buffer goes out whole, each read comes with a stamp no later than its
handling (and as old as the bytes), and the server's close is an end of file, then a loss. Each
test runs on both readings of the ready sockets: the compiled one (``_chunkscan.drain``) and the
Python one."""

from __future__ import annotations

import asyncio
import select
import socket
import struct
import time
from typing import Any

import pytest

from loadgen.load import stamped
from loadgen.load.stamped import StampedPoller, StampedTransport, open_stamped
from tests.unit.load.test_chunkscan import needs_compiled


@pytest.fixture(autouse=True, params=[pytest.param("compiled", marks=needs_compiled), "python"])
def reading(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which code reads the ready sockets (set here, whatever ``LOADGEN_CHUNK_READER`` says)."""
    if request.param == "compiled":
        from loadgen.load import _chunkscan

        monkeypatch.setattr(stamped, "DRAIN", _chunkscan.drain)
    else:
        monkeypatch.setattr(stamped, "DRAIN", None)
    return str(request.param)


class Recorder:
    def __init__(self) -> None:
        self.transport: Any = None
        self.reads: list[tuple[bytes, int, int]] = []
        self.eof = False
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def stamped(self, data: bytes, arrived: int, handled: int) -> None:
        self.reads.append((data, arrived, handled))

    def eof_received(self) -> None:
        self.eof = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set_result(exc)


def test_a_large_write_a_stamped_answer_and_the_servers_close() -> None:
    async def main() -> None:
        got = bytearray()
        size = 8 << 20  # far beyond the socket buffers: written as the socket drains

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while len(got) < size:
                got.extend(await reader.read(1 << 20))
            writer.write(b"first")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"second")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        rec = Recorder()
        poller = StampedPoller(asyncio.get_running_loop())
        transport = await open_stamped(poller, "127.0.0.1", port, rec)
        assert isinstance(transport, StampedTransport)
        assert rec.transport is transport
        transport.write(b"x" * size)
        assert await asyncio.wait_for(rec.lost, 10) is None
        assert len(got) == size
        assert b"".join(d for d, _, _ in rec.reads) == b"firstsecond"
        assert rec.eof
        assert transport.unstamped == 0
        for _, arrived, handled in rec.reads:
            assert arrived <= handled <= time.perf_counter_ns()
        # the second read's bytes left 50 ms after the first's (read on its own): the stamps say so
        assert [d for d, _, _ in rec.reads] == [b"first", b"second"]
        gap = (rec.reads[1][1] - rec.reads[0][1]) / 1e6
        assert 45 < gap < 150
        poller.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_a_refused_connection_is_an_os_error() -> None:
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        poller = StampedPoller(asyncio.get_running_loop())
        try:
            await open_stamped(poller, "127.0.0.1", port, Recorder())
        except OSError:
            return
        finally:
            poller.close()
        raise AssertionError("connected to a closed port")

    asyncio.run(main())


@pytest.mark.parametrize("loop_kind", ["uvloop", "asyncio"])
def test_a_reset_is_seen_at_once_on_either_loop(loop_kind: str) -> None:
    """A server that resets the connection (RST) after its first bytes: the transport reports the
    loss at once, on uvloop as on asyncio's own loop (uvloop's watch of a socket in error would
    drop it without a call)."""

    async def main() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(10)
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.05)
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        rec = Recorder()
        poller = StampedPoller(asyncio.get_running_loop())
        transport = await open_stamped(poller, "127.0.0.1", port, rec)
        transport.write(b"hello")
        started = time.perf_counter()
        lost = await asyncio.wait_for(rec.lost, 5)
        assert time.perf_counter() - started < 1
        assert isinstance(lost, ConnectionResetError)
        assert [d for d, _, _ in rec.reads] == [b"x"]
        poller.close()
        server.close()
        await server.wait_closed()

    if loop_kind == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def test_a_connection_whose_close_is_not_yet_handed_over_is_not_reused() -> None:
    # the server's close is read (the socket closed at once) and the protocol told in the loop's
    # next turn: a request taking a connection in between must not take this one
    from loadgen.load.connection import ClientStats, Connection, readable

    async def main() -> None:
        server = socket.create_server(("127.0.0.1", 0))
        conn = Connection(ClientStats(), 0.0)
        poller = StampedPoller(asyncio.get_running_loop())
        transport = await open_stamped(poller, "127.0.0.1", server.getsockname()[1], conn)
        assert not readable(conn)
        peer, _ = server.accept()
        peer.close()
        # the server's close arrives; the poller reads it here, within this turn of the loop
        select.select([transport.get_extra_info("socket")], [], [], 5.0)
        poller._ready()
        assert transport.is_closing()
        assert not conn.closed  # read, not yet handed over
        assert readable(conn)  # not to be reused (it was: a closed socket's fd -1, an error)
        await asyncio.sleep(0)
        assert conn.closed
        poller.close()
        server.close()

    asyncio.run(main())


def test_reads_stamped_out_of_order_give_no_negative_gap() -> None:
    """Two reads whose kernel stamps came out of order (the second 40 us before the first): the
    second token is timed with the first, never before it (one negative ITL in a 300 s soak)."""
    from loadgen.load.connection import ClientStats, Connection, Exchange
    from loadgen.load.stream import StreamState

    class Sink:
        def write(self, data: bytes) -> None:
            pass

    async def main() -> None:
        conn = Connection(ClientStats(), 0.0)
        conn.transport = Sink()  # type: ignore[assignment]
        ex = Exchange(StreamState(), asyncio.get_running_loop().create_future())
        conn.begin(ex, b"POST / HTTP/1.1\r\n\r\n")
        sent = ex.st.sent_ns
        event = b'data: {"choices": [{"index": 0, "text": " a", "finish_reason": null}]}\n\n'
        chunk = b"%x\r\n%s\r\n" % (len(event), event)
        conn.stamped(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + chunk, sent + 1_000_000, sent + 1_000_000)
        conn.stamped(chunk, sent + 960_000, sent + 1_100_000)
        assert ex.st.chunk_ns == [sent + 1_000_000, sent + 1_000_000]

    asyncio.run(main())
