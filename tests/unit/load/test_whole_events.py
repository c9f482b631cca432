"""A read of whole HTTP chunks, each one whole event, is read by the compiled reading alone
(``whole_events``), the HTTP parser left between two chunks; every other read goes through the
HTTP and SSE parsers. Any answer, cut into reads anywhere, must come out as it does with the
Python reading alone: the same tokens at the same times, the same outcome."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.load import connection, sse, stream
from loadgen.load.connection import ClientStats, Connection, Exchange
from loadgen.load.stream import StreamState
from tests.unit.load.test_chunkscan import COMMON, needs_compiled
from tests.unit.load.test_stream_property import event as odd_event

# the read path's benchmark feeds a connection as these tests do: its answer's head, its HTTP
# chunks and its transport that writes nowhere
_spec = importlib.util.spec_from_file_location("read_path", Path(__file__).parents[3] / "benchmarks" / "read_path.py")
assert _spec is not None
assert _spec.loader is not None
read_path = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(read_path)
HEAD, Transport, chunked = read_path.HEAD, read_path.Transport, read_path.chunked


def token(i: int, usage: bool) -> bytes:
    body: dict = {"id": "c", "object": "text_completion", "model": "m",
                  "choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]}
    if usage:
        body["usage"] = {"prompt_tokens": 4, "completion_tokens": i}
    return b"data: " + orjson.dumps(body) + b"\n\n"


def read_answer(reads: list[bytes], max_tokens: int = 64) -> tuple:
    """What a connection makes of an answer read as ``reads`` (a millisecond apart)."""
    loop = asyncio.new_event_loop()
    try:
        conn = Connection(ClientStats(), 0.0)
        conn.connection_made(Transport())  # type: ignore[arg-type]
        st = StreamState(None, None, max_tokens)
        ex = Exchange(st, loop.create_future())
        conn.begin(ex, b"POST / HTTP/1.1\r\n\r\n")
        t = st.sent_ns
        for data in reads:
            t += 1_000_000
            conn.stamped(data, t, t + 1000)
            if conn.closed:
                break
        if not ex.done.done():
            conn.connection_lost(None)
        done = ex.done.result() if ex.done.done() else None
        return (done, [c - st.sent_ns for c in st.chunk_ns], st.chunk_tokens, st.usage_completion, st.prompt_tokens,
                st.finish_reason, st.reasoning_tokens, st.cached_tokens, st.coalesced, st.parser.ignored_lines,
                st.done_ns - st.sent_ns if st.done_ns else None, conn.reusable)
    finally:
        loop.close()


@pytest.fixture
def taken() -> Iterator[list[int]]:
    """The reads the compiled reading took whole, counted."""
    counted: list[int] = []
    original = sse.whole_events
    assert original is not None

    def counting(data: bytes) -> list | None:
        items = original(data)
        counted.append(int(items is not None))
        return items

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(connection, "whole_events", counting)
        yield counted


def python_alone(reads: list[bytes], max_tokens: int = 64) -> tuple:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(connection, "whole_events", None)
        patch.setattr(stream, "parse_chunk", sse.read_chunk)
        return read_answer(reads, max_tokens)


@needs_compiled
def test_a_server_sending_a_token_a_chunk_is_read_by_the_compiled_reading_alone(taken: list[int]) -> None:
    tokens = [chunked(token(i, usage=True)) for i in range(1, 9)]
    reads = [HEAD + tokens[0], *tokens[1:], chunked(b"data: [DONE]\n\n"), b"0\r\n\r\n"]
    got = read_answer(reads)
    # the head's read and the end's go through the HTTP parser; the 7 tokens and [DONE] do not
    assert sum(taken) == 8
    assert got == python_alone(reads)
    assert got[0] == (None, None)
    assert got[1] == [k * 1_000_000 for k in range(1, 9)]  # each token at its read's time
    assert got[-1] is True  # the connection is kept for the next request
    # two tokens in a read, as TCP merges them: one read, both at its time
    merged = [HEAD, tokens[0] + tokens[1], *tokens[2:], chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n"]
    taken.clear()
    got = read_answer(merged)
    assert sum(taken) == 7  # the last read holds the end of the body: the HTTP parser's
    assert got == python_alone(merged)
    assert got[1][:2] == [2_000_000, 2_000_000]  # both at the read's time
    assert got[8] == 1  # a coalesced read


@needs_compiled
@pytest.mark.parametrize("held", [b"data: {\"choices\":[{\"text\":\" a\"}]}\n", b": a comment not ended", b"data: [DO"])
def test_an_event_the_sse_parser_holds_in_part_keeps_the_next_reads_on_the_parsers(
    held: bytes, taken: list[int],
) -> None:
    # a chunk that ends mid-event (a server may cut its events anywhere), then whole token chunks:
    # they continue what the SSE parser holds, and must be read with it
    tokens = [chunked(token(i, usage=False)) for i in range(1, 4)]
    reads = [HEAD + chunked(held), *tokens, chunked(b"data: [DONE]\n\n"), b"0\r\n\r\n"]
    assert read_answer(reads) == python_alone(reads)
    assert taken[0] == 1  # (its chunks were whole events: the stream's state sent it on)


@st.composite
def answers(draw: st.DrawFn) -> list[bytes]:
    """An answer's body as HTTP chunks: mostly a whole event each (of the common shapes, with
    usage or not), sometimes an event of another shape, split across chunks, two to a chunk, with
    a chunk extension, or none of that; then [DONE] or not, then the last chunk or not."""
    usage = draw(st.booleans())
    pieces: list[bytes] = []
    for i in range(1, draw(st.integers(0, 10)) + 1):
        kind = draw(st.sampled_from(["token"] * 6 + ["common", "odd", "split", "pair", "extension"]))
        data = token(i, usage) if kind != "common" else b"data: " + draw(st.sampled_from(COMMON)) + b"\n\n"
        if kind == "odd":
            data = draw(odd_event)
        if kind == "split" and len(data) > 2:
            at = draw(st.integers(1, len(data) - 1))
            pieces += [chunked(data[:at]), chunked(data[at:])]
        elif kind == "pair":
            pieces.append(chunked(data + token(i, usage)))
        elif kind == "extension":
            pieces.append(b"%x;x=1\r\n%s\r\n" % (len(data), data))
        elif data:
            pieces.append(chunked(data))
    if draw(st.booleans()):
        pieces.append(chunked(b"data: [DONE]\n\n"))
    if draw(st.integers(0, 4)):
        pieces.append(b"0\r\n\r\n")
    return pieces


@needs_compiled
@settings(max_examples=600, deadline=None)
@given(pieces=answers(), cuts=st.lists(st.integers(0, 3), max_size=30), bytes_cut=st.booleans(),
       sizes=st.lists(st.integers(1, 80), max_size=40), max_tokens=st.integers(4, 64))
def test_any_answer_read_in_any_reads_comes_out_as_the_python_reading_makes_it(
    pieces: list[bytes], cuts: list[int], bytes_cut: bool, sizes: list[int], max_tokens: int,
) -> None:
    body = HEAD + b"".join(pieces)
    reads: list[bytes] = []
    if bytes_cut:  # reads cut anywhere
        pos = 0
        for size in sizes:
            reads.append(body[pos:pos + size])
            pos += size
        reads.append(body[pos:])
    else:  # reads of whole chunks (0 to 3 a read), as a server's writes arrive
        reads.append(HEAD)
        rest = list(pieces)
        for n in cuts:
            reads.append(b"".join(rest[:n]))
            rest = rest[n:]
        reads.append(b"".join(rest))
    reads = [r for r in reads if r]
    assert read_answer(reads, max_tokens) == python_alone(reads, max_tokens)
