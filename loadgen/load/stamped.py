"""Arrival times from the kernel: a plain TCP connection read with ``recvmsg``, each read's bytes
with the time the kernel received them (``SO_TIMESTAMPNS``, Linux's software receive stamp).

Why: the asyncio transport hands over bytes when the event loop gets to the socket, so every
millisecond the loop spends on other streams would land in some stream's TTFT or ITL. With the
kernel's stamp a token's time is when its bytes arrived, whatever the loop was doing; the gap
between that stamp and the moment the client handled the read is the client's own delay,
measured for every read (``ClientStats``).

Limits: TCP merges segments that arrive before a read and keeps the newest one's stamp, so the
events of one read share a time (the reads that carried more than one event are counted); TLS
(the kernel stamps the encrypted bytes, and the SSL layer reads them) and systems without the
option use the loop's clock, and the run says which clock it used.

``StampedTransport`` stands in for the asyncio transport under ``Connection``: ``write``,
``close``, ``abort``, ``get_extra_info``; it calls the protocol's ``connection_made``,
``stamped(data, arrived_ns, handled_ns)``, ``eof_received`` and ``connection_lost``.

The sockets are watched by an epoll set of their own (``StampedPoller``), itself watched by the
event loop: one wake-up hands over every ready socket, and a socket's error (a reset) is a
readable event whose read raises it, where uvloop's own watch of a socket would drop the watch
and never call back. Where the compiled reading was built, one call reads every ready socket
(``_chunkscan.drain``) and each read is handed to its transport (``took``); else each transport
reads its own socket (``readable``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import select
import socket
import struct
import sys
import time
from collections import deque
from typing import Any

from loadgen.load.sse import COMPILED

# Linux's value where Python does not name it (SO_TIMESTAMPNS_OLD: a struct timespec of longs)
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
TIMESPEC = struct.Struct("@qq")
ANCILLARY = socket.CMSG_SPACE(TIMESPEC.size)
# at most this much per read (the rest is read at the next wake-up, with its own stamp). Below
# glibc's threshold for mapping memory: in a bare Python process a 256 KiB buffer was mapped and
# unmapped at each read (21 us against 8 us for a send and a read of 300 bytes); in loadgen's own
# process both sizes cost the same (benchmarks/read_path.py), and this one is never the worse
READ_BYTES = 64 * 1024
# the compiled reading of the ready sockets (``_chunkscan.c``: the same reads, 4.7-4.8 against
# 5.9-6.0 us a read in benchmarks/read_path.py); None where it was not built or is set aside
# (``LOADGEN_CHUNK_READER=python``)
DRAIN = getattr(COMPILED, "drain", None)

def kernel_clock_problem(tls: bool) -> str | None:
    """Why kernel receive stamps cannot time this target's bytes (None: they can)."""
    if not sys.platform.startswith("linux"):
        return f"kernel receive stamps are read on Linux only (this is {sys.platform})"
    if tls:
        return "the target is https: the kernel stamps the encrypted bytes, which the TLS layer reads"
    return None


def keep_stamping() -> socket.socket:
    """A socket that asks the kernel for receive stamps for as long as it is open: the kernel
    stamps received bytes while any socket asks, turns the stamping on a moment after the first
    one asks and off after the last one closes, so a connection opened after a gap between
    connections got its first bytes unstamped. Keep it open while connections come and go."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    return sock


class StampedPoller:
    """The epoll set of one event loop's stamped sockets, read when the loop finds it ready."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._epoll = select.epoll()
        self._transports: dict[int, StampedTransport] = {}
        loop.add_reader(self._epoll.fileno(), self._ready)
        # The kernel stamps received bytes while any socket of the machine asks for it, and turns
        # the stamping on a moment after the first one asks (deferred work), off after the last
        # one closes. Between a run's connections (its warmup's closed, the window's not yet
        # opened) it could go off, and the first bytes after it came back on arrived unstamped
        # (seen in the suite: a read stamped -1 right after its socket asked). A socket that asks
        # for the poller's whole life keeps it on.
        self._keep_stamping = keep_stamping()

    def watch(self, fd: int, transport: StampedTransport) -> None:
        self._transports[fd] = transport
        self._epoll.register(fd, select.EPOLLIN)

    def forget(self, fd: int) -> None:
        if self._transports.pop(fd, None) is not None:
            self._epoll.unregister(fd)

    def _ready(self) -> None:
        # the stamps are on the wall clock, the run's times on the monotonic one: their offset,
        # read once a wake-up rather than once a read
        offset = time.time_ns() - time.perf_counter_ns()
        transports = self._transports
        if DRAIN is not None:  # every ready socket read in compiled code, then handed over
            for transport, data, arrived in DRAIN(self._epoll.fileno(), offset, transports):
                transport.took(data, arrived)
            return
        for fd, _ in self._epoll.poll(0):
            transport = transports.get(fd)
            if transport is not None:
                transport.readable(offset)

    def close(self) -> None:
        self.loop.remove_reader(self._epoll.fileno())
        self._epoll.close()
        self._keep_stamping.close()
        self._transports.clear()


class StampedTransport:
    """One non-blocking TCP socket, its reads stamped by the kernel (see the module's notes)."""

    def __init__(self, poller: StampedPoller, sock: socket.socket, protocol: Any) -> None:
        self._loop, self._poller, self._sock, self._protocol = poller.loop, poller, sock, protocol
        self._fd = sock.fileno()
        self._out: deque[memoryview] = deque()
        self._closed = False
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.unstamped = 0  # reads that came without a stamp (timed by the loop's clock)
        protocol.connection_made(self)
        poller.watch(self._fd, self)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "socket":
            return self._sock
        if name == "peername":
            return self._sock.getpeername()
        return default

    def is_closing(self) -> bool:
        return self._closed

    def readable(self, offset: int) -> None:
        """Read what arrived; ``offset``: the wall clock less the monotonic one, in ns."""
        try:
            data, ancillary, _, _ = self._sock.recvmsg(READ_BYTES, ANCILLARY)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        arrived = -1
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(value) >= TIMESPEC.size:
                sec, nsec = TIMESPEC.unpack_from(value)
                arrived = sec * 1_000_000_000 + nsec - offset
                break
        self.took(data, arrived)

    def took(self, data: bytes | int, arrived: int) -> None:
        """A read's outcome: its bytes (empty: the peer closed) or an error number, and the kernel's
        stamp on the monotonic clock in ns (-1: none came)."""
        if self._protocol is None:  # lost meanwhile (a read handed over with others)
            return
        if data.__class__ is int:
            self._lost(OSError(data, os.strerror(data)))
            return
        handled = time.perf_counter_ns()
        if not data:
            self._poller.forget(self._fd)
            self._protocol.eof_received()
            self._lost(None)
            return
        if arrived < 0:
            self.unstamped += 1
            arrived = handled
        self._protocol.stamped(data, min(arrived, handled), handled)

    def write(self, data: bytes) -> None:
        if self._closed:
            return
        view = memoryview(data)
        if not self._out:
            try:
                sent = self._sock.send(view)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._lost(exc)
                return
            view = view[sent:]
            if not view:
                return
            self._loop.add_writer(self._fd, self._writable)
        self._out.append(view)

    def _writable(self) -> None:
        while self._out:
            view = self._out[0]
            try:
                sent = self._sock.send(view)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._lost(exc)
                return
            if sent < len(view):
                self._out[0] = view[sent:]
                return
            self._out.popleft()
        self._loop.remove_writer(self._fd)

    def close(self) -> None:
        self._lost(None)

    def abort(self) -> None:
        self._lost(None)

    def _lost(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._poller.forget(self._fd)
        if self._out:
            self._out.clear()
            self._loop.remove_writer(self._fd)
        self._sock.close()
        self._loop.call_soon(self._protocol.connection_lost, exc)
        self._protocol = None  # (the protocol holds this transport: no cycle left for the collector)


async def open_stamped(poller: StampedPoller, host: str, port: int, protocol: Any) -> StampedTransport:
    """A connected ``StampedTransport`` to ``host:port`` for ``protocol``."""
    loop = poller.loop
    try:  # an address is used as it is: no lookup in the resolver's thread
        ip = ipaddress.ip_address(host)
        infos: list[Any] = [(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, socket.SOCK_STREAM, 0, "",
                             (host, port))]
    except ValueError:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return StampedTransport(poller, sock, protocol)
    raise error or OSError(f"cannot resolve {host}")
