"""A read of whole HTTP chunks, each one whole event, is read by the compiled reading alone
(``take_tokens`` where they are all plain tokens, else ``whole_events``), the HTTP parser left
between two chunks; every other read goes through the HTTP and SSE parsers. Any answer, cut into
reads anywhere, must come out as it does with the Python reading alone: the same tokens at the
same times, the same outcome."""

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
from loadgen.workload.sessions import Answer
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


def read_answer(reads: list[bytes], max_tokens: int | None = 64, first_s: float | None = None,
                total_s: float | None = None, keep: bool = False) -> tuple:
    """What a connection makes of an answer read as ``reads`` (a millisecond apart); ``first_s``,
    ``total_s``: its deadlines; ``keep``: its answer's text kept (a session's turn)."""
    loop = asyncio.new_event_loop()
    try:
        conn = Connection(ClientStats(), 0.0)
        conn.connection_made(Transport())  # type: ignore[arg-type]
        st = StreamState(first_s, total_s, max_tokens)
        st.answer = Answer() if keep else None
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
                st.done_ns - st.sent_ns if st.done_ns else None,
                st.first_answer_ns - st.sent_ns if st.first_answer_ns else None, st.streamed, st.cum_tokens,
                st.answer.text if st.answer else None, conn.reusable)
    finally:
        loop.close()


@pytest.fixture
def taken() -> Iterator[list[int]]:
    """The reads at a chunk's end, each 1 where the compiled reading took it whole (its tokens at
    once, or its Chunks), else 0."""
    counted: list[int] = []
    original, tokens = sse.whole_events, stream.take_tokens
    assert original is not None

    def counting(data: bytes) -> list | None:
        items = original(data)
        counted.append(int(items is not None))
        return items

    def counting_tokens(data: bytes, state: StreamState, t: int) -> bool:
        took = tokens(data, state, t)
        if took:  # (else whole_events is asked, and counts it)
            counted.append(1)
        return took

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(connection, "whole_events", counting)
        patch.setattr(connection, "take_tokens", counting_tokens)
        yield counted


def python_alone(reads: list[bytes], max_tokens: int | None = 64, **state: float | bool | None) -> tuple:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(connection, "whole_events", None)
        patch.setattr(connection, "take_tokens", stream._not_taken)
        patch.setattr(stream, "parse_chunk", sse.read_chunk)
        return read_answer(reads, max_tokens, **state)  # type: ignore[arg-type]


def chunks_alone(reads: list[bytes], max_tokens: int | None = 64, **state: float | bool | None) -> tuple:
    """The compiled reading without ``take_tokens``: each read's Chunks through ``take``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(connection, "take_tokens", stream._not_taken)
        return read_answer(reads, max_tokens, **state)  # type: ignore[arg-type]


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


ANY_READS = {"pieces": answers(), "cuts": st.lists(st.integers(0, 3), max_size=30), "bytes_cut": st.booleans(),
             "sizes": st.lists(st.integers(1, 80), max_size=40), "max_tokens": st.integers(4, 64)}


@needs_compiled
@settings(max_examples=200, deadline=None)  # the slow tier draws 3,000
@given(**ANY_READS)
def test_any_answer_read_in_any_reads_comes_out_as_the_python_reading_makes_it(
    pieces: list[bytes], cuts: list[int], bytes_cut: bool, sizes: list[int], max_tokens: int,
) -> None:
    any_reads_agree(pieces, cuts, bytes_cut, sizes, max_tokens)


@needs_compiled
@pytest.mark.slow
@settings(max_examples=3_000, deadline=None)
@given(**ANY_READS)
def test_three_thousand_answers_read_in_any_reads_come_out_as_the_python_reading_makes_them(
    pieces: list[bytes], cuts: list[int], bytes_cut: bool, sizes: list[int], max_tokens: int,
) -> None:
    any_reads_agree(pieces, cuts, bytes_cut, sizes, max_tokens)


def any_reads_agree(pieces: list[bytes], cuts: list[int], bytes_cut: bool, sizes: list[int], max_tokens: int) -> None:
    """The answer made of ``pieces``, cut into reads anywhere or between whole chunks: the compiled
    reading leaves what the Python one does."""
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


@st.composite
def plain_answers(draw: st.DrawFn) -> list[bytes]:
    """An answer of plain tokens (a completions or chat chunk each, its text empty, escaped, not
    ASCII or not UTF-8 at all), their usage cumulative, jumping, going back, or absent; sometimes
    a prompt count and cached tokens, a usage-only chunk or a finish_reason; then [DONE]."""
    chat = draw(st.booleans())
    pieces: list[bytes] = []
    completion = 0
    for _ in range(draw(st.integers(1, 24))):
        text = draw(st.sampled_from([b" tok", b"", b"a\\nb", b"\\u00e9t\\u00e9", "th\u00e9".encode(),
                                     b"\xff\xfe", b"\\ud800"]))
        choice = (b'{"index":0,"delta":{"content":"%s"},"finish_reason":null}' if chat else
                  b'{"index":0,"text":"%s","finish_reason":null}') % text
        if draw(st.integers(0, 15)) == 0:
            choice = choice.replace(b"null}", b'"stop"}')
        body = b'{"id":"c","object":"x","choices":[%s]' % choice
        usage = draw(st.sampled_from(["none", "step", "step", "jump", "back", "same"]))
        if usage != "none":
            completion = max(0, completion + {"step": 1, "jump": 5, "back": -2, "same": 0}[usage])
            details = b',"prompt_tokens_details":{"cached_tokens":2}' if draw(st.booleans()) else b""
            body += b',"usage":{"prompt_tokens":5,"completion_tokens":%d%s}' % (completion, details)
        if draw(st.integers(0, 20)) == 0:
            body = b'{"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":%d}' % completion
        pieces.append(chunked(b"data: " + body + b"}\n\n"))
    return [*pieces, chunked(b"data: [DONE]\n\n"), b"0\r\n\r\n"]


PLAIN_READS = {"pieces": plain_answers(), "cuts": st.lists(st.integers(1, 3), min_size=26, max_size=26),
               "max_tokens": st.sampled_from([None, 1, 4, 64]), "first_s": st.sampled_from([None, 0.0015, 0.0035]),
               "total_s": st.sampled_from([None, 0.004, 0.0075]), "keep": st.booleans()}


@needs_compiled
@settings(max_examples=250, deadline=None)  # the slow tier draws 2,000
@given(**PLAIN_READS)
def test_a_read_of_plain_tokens_taken_at_once_leaves_the_state_the_python_reading_leaves(
    pieces: list[bytes], cuts: list[int], max_tokens: int | None, first_s: float | None, total_s: float | None,
    keep: bool,
) -> None:
    plain_reads_agree(pieces, cuts, max_tokens, first_s, total_s, keep)


@needs_compiled
@pytest.mark.slow
@settings(max_examples=2_000, deadline=None)
@given(**PLAIN_READS)
def test_two_thousand_reads_of_plain_tokens_leave_the_state_the_python_reading_leaves(
    pieces: list[bytes], cuts: list[int], max_tokens: int | None, first_s: float | None, total_s: float | None,
    keep: bool,
) -> None:
    plain_reads_agree(pieces, cuts, max_tokens, first_s, total_s, keep)


def plain_reads_agree(pieces: list[bytes], cuts: list[int], max_tokens: int | None, first_s: float | None,
                      total_s: float | None, keep: bool) -> None:
    # the reads a millisecond apart, of 1 to 3 chunks each up to the end: deadlines of 1.5 to 7.5 ms
    # pass mid-answer; a limit of 1 or 4 tokens (17 and 20 with its margin) is passed by the usage or
    # by the tokens streamed
    reads, rest = [HEAD], list(pieces)
    for n in cuts:
        reads.append(b"".join(rest[:n]))
        rest = rest[n:]
    reads.append(b"".join(rest))
    reads = [r for r in reads if r]
    state = {"first_s": first_s, "total_s": total_s, "keep": keep}
    expected = python_alone(reads, max_tokens, **state)
    assert read_answer(reads, max_tokens, **state) == expected
    assert chunks_alone(reads, max_tokens, **state) == expected


@needs_compiled
def test_plain_tokens_are_taken_at_once_and_what_decides_a_stream_is_left_to_take() -> None:
    tokens = [chunked(token(i, usage=True)) for i in range(1, 5)]
    st = StreamState(None, None, 64)
    st.sent_ns = 0
    assert stream.take_tokens(tokens[0] + tokens[1], st, 7)
    assert st.chunk_ns == [7, 7]
    assert st.chunk_tokens == [1, 1]
    assert (st.streamed, st.cum_tokens, st.usage_completion, st.prompt_tokens, st.first_answer_ns) == (2, 2, 2, 4, 7)
    # usage past the limit (64 and its margin of 16: 81), a finish_reason, [DONE], a stream read whole
    # or one whose answer is kept: each left to take, the state untouched
    past = chunked(b'data: {"choices":[{"text":"x","finish_reason":null}],"usage":{"completion_tokens":81}}\n\n')
    ending = chunked(b'data: {"choices":[{"text":"x","finish_reason":"stop"}]}\n\n')
    for read in (past, tokens[2] + ending, chunked(b"data: [DONE]\n\n"), tokens[2][:-1]):
        assert not stream.take_tokens(read, st, 9)
    assert st.chunk_ns == [7, 7]
    st.answer = Answer()
    assert not stream.take_tokens(tokens[2], st, 9)
    st.answer = None
    assert stream.take_tokens(tokens[2], st, 9)
    assert st.chunk_ns == [7, 7, 9]
    st.outcome = (None, None)
    assert not stream.take_tokens(tokens[3], st, 11)
    assert st.streamed == 3


def plain(i: int, usage: str) -> bytes:
    """Token ``i`` of a completions answer, its usage counted ``usage``'s way."""
    completion = {"none": None, "step": i, "jump": 5 * i, "back": i if i % 4 else i - 2}[usage]
    body: dict = {"choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]}
    if completion is not None:
        body["usage"] = {"prompt_tokens": 3, "completion_tokens": completion}
    return chunked(b"data: " + orjson.dumps(body) + b"\n\n")


@needs_compiled
@pytest.mark.parametrize("usage", ["none", "step", "jump", "back"])
@pytest.mark.parametrize(("max_tokens", "first_s", "total_s", "ending"), [
    (None, None, None, {"none": None, "step": None, "jump": None, "back": None}),
    # a limit of 17 (1 and its margin): 18 tokens overrun it, a usage of 18 or 20 (5 x 4) passes it; a
    # usage that goes back by 2 every fourth token has streamed 18 (its steps forward) at a usage of 15
    (1, None, None, {"none": "overrun", "step": "usage_invalid", "jump": "usage_invalid", "back": "overrun"}),
    (None, 0.0015, None, dict.fromkeys(["none", "step", "jump", "back"], "timeout")),  # the first token at 2 ms
    (None, None, 0.006, dict.fromkeys(["none", "step", "jump", "back"], "timeout")),  # the sixth at 7 ms
])
def test_plain_tokens_past_a_limit_or_a_deadline_end_the_stream_as_the_python_reading_ends_it(
    usage: str, max_tokens: int | None, first_s: float | None, total_s: float | None, ending: dict,
    taken: list[int],
) -> None:
    reads = [HEAD, *[plain(i, usage) for i in range(1, 25)], chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n"]
    got = read_answer(reads, max_tokens, first_s, total_s)
    assert got == python_alone(reads, max_tokens, first_s=first_s, total_s=total_s)
    assert got[0][0] == ending[usage]
    if first_s is None:
        assert sum(taken) >= 3  # the tokens before the end were taken at once


@needs_compiled
def test_usage_a_chunk_behind_its_text_still_times_the_first_token_at_the_first_text(taken: list[int]) -> None:
    """A server whose usage counts the tokens before the chunk it rides on (completion_tokens 0
    with the first text, 1 with the second...): each text is a token when it comes, the first
    token at the first text (it was the second), and the count is the final usage's."""
    tokens = [chunked(token(i, usage=True)) for i in range(0, 8)]  # text t0 with usage 0 ... t7 with 7
    last = chunked(b'data: {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 8}}\n\n')
    reads = [HEAD + tokens[0], *tokens[1:], last, chunked(b"data: [DONE]\n\n"), b"0\r\n\r\n"]
    got = read_answer(reads)
    assert got == python_alone(reads) == chunks_alone(reads)
    assert got[0] == (None, None)
    assert got[1] == [k * 1_000_000 for k in range(1, 9)]  # 8 tokens, the first at the first read
    assert got[2] == [1] * 8
    assert got[3] == 8  # the final usage
    assert sum(taken) >= 7  # (the compiled reading took the tokens' reads, as the Python one reads them)
