from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.load.sse import SSEParser

STREAM = (
    'data: {"choices":[{"text":"h\u00e9llo \u4e16\u754c \U0001f600"}]}\n\n'
    ": keep-alive comment\n\n"
    "event: message\n"
    'data: {"a":1}\n'
    'data: {"b":2}\n\n'
    "data:no-space\n\n"
    "data: [DONE]\n\n"
).encode()
EXPECTED = [
    '{"choices":[{"text":"h\u00e9llo \u4e16\u754c \U0001f600"}]}'.encode(),
    b'{"a":1}\n{"b":2}',
    b"no-space",
    b"[DONE]",
]


def feed_all(parts: list[bytes]) -> list[bytes]:
    p = SSEParser()
    events: list[bytes] = []
    for part in parts:
        events += p.feed(part)
    return events + p.finish()


def test_whole_stream() -> None:
    assert feed_all([STREAM]) == EXPECTED


def test_every_two_way_split_including_mid_utf8() -> None:
    # the emoji and CJK characters are multi-byte: some split points fall inside them
    for i in range(len(STREAM) + 1):
        assert feed_all([STREAM[:i], STREAM[i:]]) == EXPECTED, i


def test_byte_by_byte() -> None:
    assert feed_all([bytes([b]) for b in STREAM]) == EXPECTED


def test_crlf_and_lone_cr_line_ends_split_between_cr_and_lf() -> None:
    crlf = STREAM.replace(b"\n", b"\r\n")
    for i in range(len(crlf) + 1):
        assert feed_all([crlf[:i], crlf[i:]]) == EXPECTED, i
    assert feed_all([STREAM.replace(b"\n", b"\r")]) == EXPECTED


def test_payload_decodes_as_utf8_after_arbitrary_split() -> None:
    events = feed_all([STREAM[:20], STREAM[20:21], STREAM[21:]])
    assert events[0].decode("utf-8").endswith('\U0001f600"}]}')


def test_last_event_without_blank_line_is_returned_by_finish() -> None:
    p = SSEParser()
    assert p.feed(b"data: x\n\ndata: y") == [b"x"]
    assert p.finish() == [b"y"]


def test_lines_without_a_field_are_counted_not_emitted() -> None:
    p = SSEParser()
    assert p.feed(b'{"choices":[]}\n\n') == []
    assert p.ignored_lines == 1


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split_points(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    parts = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    assert feed_all(parts) == EXPECTED


def test_reasoning_deltas_are_output_marked_as_thinking_and_cached_tokens_are_read() -> None:
    from loadgen.load.sse import parse_chunk

    for field in ("reasoning_content", "reasoning"):
        chunk = parse_chunk(b'{"choices":[{"index":0,"delta":{"%s":"hmm"},"finish_reason":null}]}' % field.encode())
        assert (chunk.text, chunk.reasoning) == ("hmm", True)
    answer = parse_chunk(b'{"choices":[{"index":0,"delta":{"content":"yes","reasoning_content":null}}]}')
    assert (answer.text, answer.reasoning) == ("yes", False)
    usage = parse_chunk(b'{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,'
                        b'"prompt_tokens_details":{"cached_tokens":8}}}')
    assert usage.cached_tokens == 8


def _stream(chunks: list[bytes]) -> tuple[list[int], int | None]:
    from loadgen.load.stream import StreamState

    state = StreamState()
    state.sent_ns = 1
    body = b"".join(b"data: " + c + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    state.feed(body, 10)
    return state.chunk_tokens, state.usage_completion


def test_a_total_on_the_last_chunk_is_not_cumulative_usage() -> None:
    # llama.cpp: text chunks without usage, then the finish chunk carries the request's total
    tokens, total = _stream([
        b'{"choices":[{"text":" a","index":0,"finish_reason":null}]}',
        b'{"choices":[{"text":" b","index":0,"finish_reason":null}]}',
        b'{"choices":[{"text":" c","index":0,"finish_reason":null}]}',
        b'{"choices":[{"text":"","index":0,"finish_reason":"length"}],"usage":{"prompt_tokens":7,"completion_tokens":3}}',
    ])
    assert (tokens, total) == ([1, 1, 1], 3)
    # vLLM with continuous usage: every chunk's usage is cumulative
    tokens, total = _stream([
        b'{"choices":[{"text":" a b","index":0}],"usage":{"prompt_tokens":7,"completion_tokens":2}}',
        b'{"choices":[{"text":" c","index":0,"finish_reason":"length"}],"usage":{"prompt_tokens":7,"completion_tokens":3}}',
        b'{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}',
    ])
    assert (tokens, total) == ([2, 1], 3)


def test_an_event_over_the_cap_ends_the_request_as_malformed() -> None:
    from loadgen.load.sse import EventTooLarge, SSEParser
    from loadgen.load.stream import StreamState

    parser = SSEParser(max_event_bytes=1000)
    assert parser.feed(b"data: " + b"x" * 500) == []  # a line still going on, under the cap
    with pytest.raises(EventTooLarge):
        parser.feed(b"x" * 600)
    # an endless line, fed in reads that never end it, stops at the cap instead of growing
    parser = SSEParser(max_event_bytes=1000)
    for _ in range(10):
        parser.feed(b"y" * 100)
    with pytest.raises(EventTooLarge):
        parser.feed(b"y" * 100)
    # an event over the cap that came whole in one read
    with pytest.raises(EventTooLarge):
        SSEParser(max_event_bytes=1000).feed(b"data: " + b"w" * 1200 + b"\n\n")
    # many data lines of one event count together
    parser = SSEParser(max_event_bytes=1000)
    with pytest.raises(EventTooLarge):
        parser.feed(b"data: " + b"z" * 600 + b"\ndata: " + b"z" * 600 + b"\n")
    state = StreamState()
    state.parser = SSEParser(max_event_bytes=1000)
    state.sent_ns = 1
    assert state.feed(b'data: {"choices":[{"text":"' + b"a" * 2000, 5) is True
    assert state.outcome == ("malformed", "an event of over 0 MiB")


def test_a_long_line_split_over_many_reads_is_one_event() -> None:
    from loadgen.load.sse import SSEParser

    parser = SSEParser()
    body = b"data: " + b"q" * 100_000 + b"\r\n\r\ndata: next\r\n\r\n"
    events: list[bytes] = []
    for i in range(0, len(body), 777):
        events += parser.feed(body[i:i + 777])
    events += parser.finish()
    assert events == [b"q" * 100_000, b"next"]


def test_impossible_usage_is_not_believed() -> None:
    from loadgen.load.stream import StreamState

    for usage in (b'{"completion_tokens":-21514,"prompt_tokens":7}', b'{"completion_tokens":3,"prompt_tokens":-1}',
                  b'{"completion_tokens":"3","prompt_tokens":7}', b'{"completion_tokens":99999999999,"prompt_tokens":7}'):
        state = StreamState()
        state.sent_ns = 1
        state.feed(b'data: {"choices":[{"text":" a","index":0}]}\n\ndata: {"choices":[],"usage":' + usage
                   + b"}\n\ndata: [DONE]\n\n", 5)
        assert state.outcome is not None
        assert state.outcome[0] == "usage_invalid", usage


def test_responses_api_events() -> None:
    from loadgen.load.sse import parse_chunk

    delta = parse_chunk(b'{"type":"response.output_text.delta","delta":" hello","sequence_number":4}')
    assert (delta.text, delta.has_choices, delta.reasoning, delta.final) == (" hello", True, False, False)
    thought = parse_chunk(b'{"type":"response.reasoning_text.delta","delta":" hmm"}')
    assert (thought.text, thought.reasoning) == (" hmm", True)
    created = parse_chunk(b'{"type":"response.created","response":{"status":"in_progress","usage":null}}')
    assert (created.text, created.has_choices, created.final, created.error) == ("", False, False, None)
    done = parse_chunk(b'{"type":"response.completed","response":{"status":"completed","usage":{"input_tokens":32,'
                       b'"input_tokens_details":{"cached_tokens":16},"output_tokens":8,"total_tokens":40}}}')
    assert (done.prompt_tokens, done.completion_tokens, done.cached_tokens, done.finish_reason, done.final) == (
        32, 8, 16, "completed", True)
    failed = parse_chunk(b'{"type":"response.failed","response":{"error":{"message":"out of memory"}}}')
    assert failed.error == "out of memory"


def test_a_responses_stream_ends_at_its_last_event() -> None:
    from loadgen.load.stream import StreamState

    state = StreamState(max_tokens=2)
    events = [
        b'event: response.created\ndata: {"type":"response.created","response":{"status":"in_progress"}}\n\n',
        b'data: {"type":"response.output_text.delta","delta":" a"}\n\n',
        b'data: {"type":"response.output_text.delta","delta":" b"}\n\n',
        b'data: {"type":"response.completed","response":{"status":"completed","usage":{"input_tokens":5,'
        b'"output_tokens":2}}}\n\n',
    ]
    decided = [state.feed(e, t) for t, e in enumerate(events, 1)]
    assert decided == [False, False, False, True]
    assert state.outcome == (None, None)
    assert (state.chunk_ns, state.chunk_tokens, state.usage_completion, state.prompt_tokens, state.done_ns) == (
        [2, 3], [1, 1], 2, 5, 4)


def test_whole_one_line_events_and_the_shapes_around_them() -> None:
    # what servers send (one "data: " line an event) is taken whole; an event begun in an
    # earlier read, extra blank lines, a comment or a multi-line event between them are read
    # line by line and give the same events
    p = SSEParser()
    assert p.feed(b"data: a\n") == []
    assert p.feed(b"data: b\n\ndata: c\n\n") == [b"a\nb", b"c"]
    assert p.feed(b"data: d\n\n\n\ndata: e\n\n: ping\n\ndata: f\ndata: g\n\ndata: h\n\ndata: i") == [
        b"d", b"e", b"f\ng", b"h"]
    assert p.feed(b"\n\n") == [b"i"]
    assert p.feed(b"data:j\n\nevent: x\ndata: k\n\n") == [b"j", b"k"]


FRAGMENTS = [b"data: ", b"data:", b"event: x", b"{\"t\":1}", b"[DONE]", b"\n", b"\n\n", b"\r", b"\r\n", b": ping", b"x"]


@given(st.lists(st.lists(st.sampled_from(FRAGMENTS), max_size=6).map(b"".join), max_size=8))
def test_a_read_of_one_whole_event_gives_what_reading_it_byte_by_byte_gives(reads: list[bytes]) -> None:
    # a read that is one whole "data: " event with nothing pending is taken in one step; any
    # read, whole or not, must give the events the line-by-line reading of its bytes gives
    # (each read followed by whole events made of it: one line, and the same with a CR inside)
    flat = [read.replace(b"\n", b"").replace(b"\r", b"") for read in reads]
    reads = [r for read, line in zip(reads, flat, strict=True)
             for r in (read, b"data: " + line + b"\n\n", b"data: " + line + b"\r\n\n", b"data: \r" + line + b"\n\n")]
    assert feed_all(reads) == feed_all([bytes([b]) for r in reads for b in r])
