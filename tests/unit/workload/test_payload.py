from __future__ import annotations

import pytest

from loadgen.load.sse import MalformedChunk, parse_chunk
from loadgen.scenario.target import Sampling
from loadgen.workload.payload import Prompt, build_payload


def test_completions_payload_forces_output_length_and_asks_for_usage() -> None:
    body = build_payload(
        "completions", "m", Prompt(3, token_ids=(5, 6, 7)), 64,
        sampling=Sampling(temperature=0.7, top_k=20),
    )
    assert body == {
        "model": "m", "prompt": [5, 6, 7], "max_tokens": 64, "ignore_eos": True, "min_tokens": 64,
        "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "temperature": 0.7, "top_k": 20,
    }


def test_chat_payload_wraps_text_and_rejects_token_ids() -> None:
    body = build_payload("chat", "m", Prompt(4, text="a b"), 8, sampling=Sampling(),
                         min_tokens=False, continuous_usage_stats=False)
    assert body["messages"] == [{"role": "user", "content": "a b"}]
    assert "min_tokens" not in body
    assert body["stream_options"] == {"include_usage": True}
    with pytest.raises(ValueError, match="chat request needs text"):
        build_payload("chat", "m", Prompt(1, token_ids=(1,)), 8, sampling=Sampling())


def test_parse_chunk_variants() -> None:
    role = parse_chunk(b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}')
    assert role.text == ""
    assert role.has_choices
    c = parse_chunk(b'{"choices":[{"text":" hi","finish_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":2}}')
    assert (c.text, c.completion_tokens, c.prompt_tokens) == (" hi", 2, 3)
    final = parse_chunk(b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9}}')
    assert not final.has_choices
    assert final.completion_tokens == 9
    err = parse_chunk(b'{"object":"error","message":"boom"}')
    assert err.error == "boom"
    for bad in (b"{not json", b"[1,2]", b'{"id":"x"}'):
        with pytest.raises(MalformedChunk):
            parse_chunk(bad)


def test_chat_sends_max_completion_tokens_and_extra_body_last() -> None:
    from loadgen.scenario.target import Sampling, Target
    from loadgen.workload.payload import Prompt, build_payload

    target = Target(api="chat", extra_body={"top_k": 3, "response_format": {"type": "json_object"}})
    body = build_payload("chat", "m", Prompt(None, text="hi"), 7, sampling=Sampling(top_k=1), target=target)
    assert (body["max_completion_tokens"], body["max_tokens"]) == (7, 7)
    assert body["top_k"] == 3  # extra_body wins over the sampling block
    assert body["response_format"] == {"type": "json_object"}
    only = build_payload("chat", "m", Prompt(None, text="hi"), 7, sampling=Sampling(),
                         target=Target(max_tokens_param="max_completion_tokens"))
    assert "max_tokens" not in only
    completions = build_payload("completions", "m", Prompt(None, text="hi"), 7, sampling=Sampling(), target=target)
    assert "max_completion_tokens" not in completions
