"""The client's CPU per token on its read path, without a network: what one core can parse.

A streamed completions answer as an OpenAI-compatible server sends it (HTTP/1.1 chunked, one SSE
event per token, usage on every chunk, ``[DONE]``) is fed to loadgen's ``Connection`` exactly as
the stamped transport hands over a read: ``stamped(bytes, arrived, handled)``. Each answer's
``--tokens`` events are read ``--per-read`` at a time (1: each token its own read, as at low load;
4: what TCP merges at C=1024 on one client core). The figure is CPU microseconds per token for
the whole path (HTTP parser, SSE parser, chunk reader, token bookkeeping, the request's record);
the kernel's share of a real read (``recvmsg``) is not in it: ``client_capacity.py`` measures the
whole client against a server. Then the kernel's part of one stamped read in this process, with
the client's buffer and with a 256 KiB one (past glibc's first threshold for mapping memory: in
a bare Python process each read of that size mapped and unmapped its buffer, 21 against 8 µs;
here the two cost the same), a read of 64 ready sockets by the kernel clock's poller (the
compiled reading of the sockets and the Python one), and the progress bar's cost per finished
request (its live tokens/s) over 30 s at C=1024, and its longest single call (the loop does
nothing else meanwhile).

    python benchmarks/read_path.py [--tokens 256] [--per-read 1,4] [--answers 2000]

Prints figures; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import orjson

from loadgen.load.connection import ClientStats, Connection, Exchange
from loadgen.load.stream import StreamState
from loadgen.workload.payload import PreparedRequest

HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
        b"connection: keep-alive\r\n\r\n")


def event(i: int, tokens: int) -> bytes:
    body = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "text": " tok", "logprobs": None,
                         "finish_reason": "length" if i == tokens else None}],
            "usage": {"prompt_tokens": 64, "completion_tokens": i, "total_tokens": 64 + i}}
    return b"data: " + orjson.dumps(body) + b"\n\n"


def chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def reads_of(tokens: int, per_read: int) -> list[bytes]:
    """One answer as the reads a client gets: the head with the first read, ``per_read`` events each."""
    events = [chunked(event(i, tokens)) for i in range(1, tokens + 1)] + [chunked(b"data: [DONE]\n\n"), b"0\r\n\r\n"]
    reads = [b"".join(events[i:i + per_read]) for i in range(0, len(events), per_read)]
    reads[0] = HEAD + reads[0]
    return reads


class Transport:
    """What ``Connection`` writes to: nothing (the answer is already in memory)."""

    def write(self, data: bytes) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def abort(self) -> None:
        pass

    close = abort


def measure(tokens: int, per_read: int, answers: int) -> tuple[float, float]:
    """(CPU µs per token, of which building the records) for ``answers`` answers."""
    loop = asyncio.new_event_loop()
    reads = reads_of(tokens, per_read)
    req = PreparedRequest(0, b"{}", 64, tokens)
    stats = ClientStats()
    conn = Connection(stats, 0.0)
    conn.connection_made(Transport())  # type: ignore[arg-type]
    record_ns = 0
    start = time.process_time_ns()
    for n in range(answers):
        st = StreamState(None, None, tokens)
        ex = Exchange(st, loop.create_future())
        conn.begin(ex, b"POST / HTTP/1.1\r\n\r\n")
        t = time.perf_counter_ns()
        for data in reads:
            t += 1_000_000
            conn.stamped(data, t, t + 1000)
        if not ex.done.done() or ex.done.result() != (None, None):
            raise SystemExit(f"the answer was not read whole: {ex.done}")
        mark = time.process_time_ns()
        st.record(req, n, st.sent_ns, 0, None, None)
        record_ns += time.process_time_ns() - mark
        stats.delays.clear()
    total = time.process_time_ns() - start
    loop.close()
    per = answers * tokens * 1e3
    return total / per, record_ns / per


def live_rate_cost(concurrency: int, seconds: float, tokens: int) -> tuple[float, float]:
    """The progress bar's live tokens/s over a closed-loop run of ``seconds`` at ``concurrency``
    (each request TTFT 50 ms, ITL 10 ms): (CPU µs per record, the longest single call in ms), its
    rate read every 0.25 s of the run as the bar does."""
    from loadgen.report.progress import LiveRate
    from loadgen.results.records import RequestRecord

    offsets = tuple(0.05 + 0.01 * k for k in range(tokens))
    e2e = offsets[-1]
    live = LiveRate()
    n = int(seconds / e2e) * concurrency
    records = [RequestRecord(
        request_id=i, cell=0, warmup=False, scheduled_at=0.0, sent_at=(i // concurrency) * e2e,
        first_token_at=None, last_token_at=None, done_at=(i // concurrency) * e2e + e2e, input_tokens=64,
        max_tokens=tokens, prompt_tokens=64, output_tokens=tokens, token_count_source="usage",
        chunk_tokens_total=tokens, chunk_offsets_s=offsets, chunk_tokens=(1,) * tokens, status=200, error=None,
        error_detail=None) for i in range(n)]
    longest, next_rate = 0, 0.0
    start = time.process_time_ns()
    for r in records:
        mark = time.perf_counter_ns()
        live.add(r)
        if r.done_at is not None and r.done_at >= next_rate:
            next_rate = r.done_at + 0.25
            live.rate()
        longest = max(longest, time.perf_counter_ns() - mark)
    return (time.process_time_ns() - start) / n / 1e3, longest / 1e6


def kernel_read_cost(size: int, rounds: int = 30_000) -> float:
    """µs for a send of 300 bytes and a stamped ``recvmsg`` of at most ``size`` bytes on TCP
    loopback (both on this core: the figure holds the kernel's whole path, both ends)."""
    import socket
    import timeit

    from loadgen.load.stamped import ANCILLARY, SO_TIMESTAMPNS

    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = socket.create_connection(server.getsockname())
        reader, _ = server.accept()
        with sender, reader:
            sender.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            message = b"x" * 300

            def one() -> None:
                sender.send(message)
                reader.recvmsg(size, ANCILLARY)

            return min(timeit.repeat(one, number=rounds, repeat=3)) / rounds * 1e6


def ready_reads_cost(compiled: bool, sockets: int = 64, rounds: int = 2_000) -> float:
    """µs a read for the kernel clock's poller to read ``sockets`` ready sockets (300 bytes each, on
    TCP loopback) and hand each read to its protocol: with the compiled reading of the sockets
    (``_chunkscan.drain``) or the Python one (``recvmsg`` a socket). The sends are not counted."""
    import socket

    from loadgen.load import stamped

    class Protocol:
        def connection_made(self, transport: object) -> None:
            pass

        def stamped(self, data: bytes, arrived: int, handled: int) -> None:
            pass

        def connection_lost(self, exc: Exception | None) -> None:
            pass

    loop = asyncio.new_event_loop()
    saved = stamped.DRAIN
    stamped.DRAIN = saved if compiled else None
    poller = stamped.StampedPoller(loop)
    peers, ours = [], []
    try:
        with socket.create_server(("127.0.0.1", 0), backlog=sockets) as server:
            for _ in range(sockets):
                sock = socket.create_connection(server.getsockname())
                sock.setblocking(False)
                ours.append(stamped.StampedTransport(poller, sock, Protocol()))
                peer = server.accept()[0]
                peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                peers.append(peer)
        message = b"x" * 300
        spent = 0
        for _ in range(rounds):
            for peer in peers:
                peer.send(message)
            start = time.perf_counter_ns()
            poller._ready()
            spent += time.perf_counter_ns() - start
        return spent / rounds / sockets / 1e3
    finally:
        stamped.DRAIN = saved
        for transport in ours:
            transport.close()
        for peer in peers:
            peer.close()
        poller.close()
        loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="tokens per answer")
    parser.add_argument("--per-read", default="1,4", help="events per read, comma separated")
    parser.add_argument("--answers", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (the least is printed)")
    args = parser.parse_args()
    print("events per read | CPU µs per token | of which the record")
    print("--- | --- | ---")
    for k in (int(x) for x in args.per_read.split(",")):
        runs = [measure(args.tokens, k, args.answers) for _ in range(args.repeat)]
        best = min(runs)
        print(f"{k} | {best[0]:.2f} | {best[1]:.2f}")
    from loadgen.load.stamped import READ_BYTES

    print(f"\na send and a stamped read of 300 bytes on TCP loopback: {kernel_read_cost(READ_BYTES):.1f} µs with "
          f"the client's {READ_BYTES >> 10} KiB buffer, {kernel_read_cost(256 << 10):.1f} µs with a 256 KiB one")
    from loadgen.load.stamped import DRAIN

    python_reads = min(ready_reads_cost(False) for _ in range(args.repeat))
    compiled_reads = f"{min(ready_reads_cost(True) for _ in range(args.repeat)):.2f} µs" if DRAIN else "not built"
    print(f"64 ready sockets read by the kernel clock's poller, a read each: {python_reads:.2f} µs a read with the "
          f"Python reading, {compiled_reads} with the compiled one (the sends not counted)")
    cost, longest = live_rate_cost(1024, 30.0, args.tokens)
    print(f"\nthe progress bar's live tokens/s, a 30 s run at C=1024: {cost:.1f} µs per record, "
          f"its longest call {longest:.2f} ms")


if __name__ == "__main__":
    main()
