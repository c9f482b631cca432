"""Property-based fuzzing of what reads user and server input: the scenario loader either
returns a scenario or raises ScenarioError with a one-line message naming the source; the SSE
parser and stream accounting take any bytes, split anywhere, without raising."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen.errors import ScenarioError
from loadgen.load.sse import SSEParser
from loadgen.load.stream import StreamState
from loadgen.scenario.loader import parse_scenario
from loadgen.scenario.matrix import expand_cells
from loadgen.scenario.schema import Scenario

KEYS = ["name", "kind", "speed", "target", "workload", "load", "slo", "serve", "matrix", "seed", "note",
        "base_url", "api", "model", "timeouts", "num_prompts", "input_tokens", "output_tokens", "concurrency",
        "rate", "arrival", "duration_s", "warmup_requests", "backend", "sim", "faults", "ttft_ms", "prompt",
        "file", "abort_on_error_rate", "axes", "exclude", "overrides", "set", "when", "gpus", "tp", "quant"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10, max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["chat", "completions", "sim", "vllm", "unlimited", "poisson", "tiny", "http://127.0.0.1:1/v1"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=5),
    ),
    max_leaves=25,
)
documents = st.dictionaries(st.sampled_from(KEYS), values, max_size=6)


def refusal(load: Callable[[], object]) -> str | None:
    """The ScenarioError message a load raised, or None when it succeeded (anything else raises)."""
    try:
        load()
    except ScenarioError as exc:
        return str(exc)
    return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # the slow tier: 1,000
@given(documents)
def test_scenario_loader_accepts_or_explains(data: dict[str, Any]) -> None:
    accepts_or_explains(data)


@pytest.mark.slow
@settings(max_examples=1_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_scenario_loader_accepts_or_explains_a_thousand_documents(data: dict[str, Any]) -> None:
    accepts_or_explains(data)


def accepts_or_explains(data: dict[str, Any]) -> None:
    """A scenario document loads and expands into cells, or is refused in one line naming the file."""
    scenarios: list[Scenario] = []
    message = refusal(lambda: scenarios.append(parse_scenario(data, "fuzz.yaml")))
    if message is None:
        message = refusal(lambda: expand_cells(scenarios[0], "fuzz.yaml"))
    if message is not None:
        assert message.startswith("fuzz.yaml")
        assert "\n" not in message


@settings(max_examples=300, deadline=None)
@given(st.one_of(values, st.lists(values, max_size=3)))
def test_scenario_loader_survives_any_top_level_value(data: Any) -> None:
    message = refusal(lambda: parse_scenario(data, "fuzz.yaml"))
    assert message is None or message.startswith("fuzz.yaml")


events = st.lists(
    st.one_of(
        st.binary(max_size=40),
        st.sampled_from([
            b"data: [DONE]\n\n", b'data: {"choices":[{"text":"a"}]}\n\n', b"data: {oops\n\n", b": ping\n\n",
            b'data: {"usage":{"completion_tokens":3}}\n\n', b"\r\n", b"\r", b"event: x\n", b'{"choices":[]}\n\n',
            b'data: {"error":{"message":"boom"}}\n\n', b'data: {"choices":[{"delta":{"content":"\xc3\xa9"}}]}\n\n',
        ]),
    ),
    max_size=12,
)


@settings(max_examples=400, deadline=None)
@given(events, st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_sse_parser_and_stream_state_take_any_bytes(parts: list[bytes], cuts: list[int]) -> None:
    body = b"".join(parts)
    bounds = sorted({0, len(body), *(c for c in cuts if c <= len(body))})
    pieces = [body[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    whole = SSEParser()
    expected = whole.feed(body) + whole.finish()
    split = SSEParser()
    got = [e for p in pieces for e in split.feed(p)] + split.finish()
    assert got == expected  # the split never changes what is parsed
    st_ = StreamState()
    for t, p in enumerate(pieces):
        st_.feed(p, t)
    error, _ = st_.end(len(pieces))
    assert error in (None, "malformed", "stream_error", "stream_cut", "usage_invalid")
    assert sum(st_.chunk_tokens) >= 0
