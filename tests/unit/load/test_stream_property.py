"""Random event streams, cut at random byte boundaries, never escape the stream reader: every
request ends with one outcome (a success or a failure class) and one record."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.load.stream import StreamState
from loadgen.results.records import FailureClass
from loadgen.workload.payload import PreparedRequest

CLASSES = set(FailureClass.__args__)  # type: ignore[attr-defined]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
usage = st.fixed_dictionaries({}, optional={
    "completion_tokens": json_values | st.integers(-5, 10**12), "prompt_tokens": json_values | st.integers(0, 100),
})
choice = st.fixed_dictionaries({}, optional={
    "text": json_values, "delta": json_values | st.fixed_dictionaries({}, optional={"content": json_values}),
    "finish_reason": json_values | st.sampled_from(["stop", "length"]),
})
chunk = st.fixed_dictionaries({}, optional={
    "choices": json_values | st.lists(choice | json_values, max_size=2), "usage": usage | json_values,
    "error": json_values, "object": st.sampled_from(["text_completion", "chat.completion.chunk", "error"]),
})
event = st.one_of(
    chunk.map(lambda c: b"data: " + orjson.dumps(c) + b"\n\n"),
    st.just(b"data: [DONE]\n\n"),
    st.just(b": keep-alive\n\n"),
    st.binary(max_size=40),
    st.text(max_size=30).map(lambda t: ("data: " + t + "\n\n").encode()),
)


@settings(max_examples=400, deadline=None)
@given(events=st.lists(event, max_size=12), cuts=st.lists(st.integers(1, 64), max_size=20),
       max_tokens=st.integers(1, 64))
def test_any_stream_ends_in_one_record_with_a_class(events: list[bytes], cuts: list[int], max_tokens: int) -> None:
    body = b"".join(events)
    state = StreamState(None, None, max_tokens)
    state.sent_ns = 1
    t = 2
    decided = False
    pos = 0
    for size in [*cuts, len(body)]:
        piece, pos = body[pos:pos + size], pos + size
        if piece:
            t += 1
            decided = state.feed(piece, t)
        if decided or pos >= len(body):
            break
    error, detail = state.outcome if decided and state.outcome is not None else state.end(t + 1)
    assert error is None or error in CLASSES
    assert (error is None) == (detail is None) or error is not None
    req = PreparedRequest(0, b"{}", 8, max_tokens)
    record = state.record(req, 0, 0, 0, error, detail)
    assert record.error == error
    assert record.output_tokens >= 0
    # no success reports more tokens than max_tokens can give
    if error is None:
        assert record.output_tokens <= max_tokens + max(16, max_tokens // 10)
