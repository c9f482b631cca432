"""pyfloor: the floor of a Python client's read path, for benchmarks/client_capacity.py --floor.

The reference client (refclient.c) in Python, built as loadgen's kernel-clock path is: a uvloop
event loop watching an epoll set of its own, each ready socket read with ``recvmsg`` and the
kernel's receive stamp. It parses nothing: a token is a ``data: {`` in the bytes, a request ends
at ``data: [DONE]``. What it costs a token is what any Python client pays before it reads a
single field of an answer; what loadgen costs beyond it is its parsing and bookkeeping.

    python benchmarks/fastsim/pyfloor.py PORT C PER_STREAM MAX_TOKENS

Prints refclient's JSON object: requests, tokens, span_s, cpu_s, reads, multi_event_reads, and
every TTFT, ITL and TPOT in microseconds.
"""

from __future__ import annotations

import asyncio
import resource
import select
import socket
import sys
import time

import orjson
import uvloop

# the socket option and its ancillary data as loadgen's kernel clock reads them
from loadgen.load.stamped import ANCILLARY, SO_TIMESTAMPNS, TIMESPEC


class Stream:
    __slots__ = ("sock", "done", "tokens", "tail", "sent", "first", "last")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.done, self.tokens, self.tail = sock, 0, 0, b""
        self.sent = self.first = self.last = 0


def main() -> None:
    port, c, per_stream, max_tokens = (int(a) for a in sys.argv[1:5])
    body = orjson.dumps({"model": "loadgen-sim", "max_tokens": max_tokens, "stream": True,
                         "prompt": list(range(1, 65))})
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    poll = select.epoll()
    streams: dict[int, Stream] = {}
    for _ in range(c):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        streams[sock.fileno()] = Stream(sock)
        poll.register(sock.fileno(), select.EPOLLIN)
    ttft: list[int] = []
    itl: list[int] = []
    tpot: list[int] = []
    counts = {"requests": 0, "tokens": 0, "reads": 0, "multi_event_reads": 0, "active": c, "end": 0}

    def send(s: Stream) -> None:
        s.sent, s.tokens = time.perf_counter_ns(), 0
        s.sock.send(request)

    def read(s: Stream, offset: int) -> None:
        data, ancillary, _, _ = s.sock.recvmsg(65536, ANCILLARY)
        t = time.perf_counter_ns()
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = TIMESPEC.unpack_from(value)
                t = sec * 1_000_000_000 + nsec - offset
        counts["reads"] += 1
        buf = s.tail + data if s.tail else data
        k = buf.count(b"data: {")
        if k:
            if s.tokens == 0:
                ttft.append(t - s.sent)
                s.first = t
            else:
                itl.append(t - s.last)
            itl.extend([0] * (k - 1))  # the read's other tokens share its time
            s.last = counts["end"] = t
            s.tokens += k
            counts["tokens"] += k
            counts["multi_event_reads"] += k > 1
        if b"data: [DONE]" in buf:
            counts["requests"] += 1
            if s.tokens > 1:
                tpot.append((s.last - s.first) // (s.tokens - 1))
            s.tail, s.done = b"", s.done + 1
            if s.done < per_stream:
                send(s)
            else:
                counts["active"] -= 1
        else:
            s.tail = buf[buf.rfind(b"\n") + 1:]

    async def run() -> None:
        loop = asyncio.get_running_loop()
        finished = loop.create_future()

        def ready() -> None:
            offset = time.time_ns() - time.perf_counter_ns()
            for fd, _ in poll.poll(0):
                read(streams[fd], offset)
            if counts["active"] <= 0 and not finished.done():
                finished.set_result(None)

        loop.add_reader(poll.fileno(), ready)
        for s in streams.values():
            send(s)
        await finished

    before = resource.getrusage(resource.RUSAGE_SELF)
    first = time.perf_counter_ns()
    uvloop.run(run())
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(orjson.dumps({
        "requests": counts["requests"], "tokens": counts["tokens"], "span_s": (counts["end"] - first) / 1e9,
        "cpu_s": cpu, "reads": counts["reads"], "multi_event_reads": counts["multi_event_reads"],
        "ttft_us": [v // 1000 for v in ttft], "itl_us": [v // 1000 for v in itl],
        "tpot_us": [v // 1000 for v in tpot],
    }).decode())


if __name__ == "__main__":
    main()
