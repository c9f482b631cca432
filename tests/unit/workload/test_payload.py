from __future__ import annotations

import orjson
import pytest

from loadgen.load.sse import MalformedChunk, parse_chunk
from loadgen.scenario.schema import Sampling, Workload
from loadgen.workload.payload import Prompt, build_payload
from loadgen.workload.prompts import TextCalibration, build_prompts


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


def test_token_id_prompts_are_exact_and_reproducible() -> None:
    w = Workload(num_prompts=5, token_id_range=(100, 200))
    a = build_prompts(w, 37, api="completions", seed=3)
    assert all(p.token_ids is not None and len(p.token_ids) == 37 for p in a)
    assert all(100 <= t < 200 for p in a for t in p.token_ids or ())
    assert a == build_prompts(w, 37, api="completions", seed=3)
    assert a != build_prompts(w, 37, api="completions", seed=4)


def test_text_prompts_follow_the_calibration() -> None:
    w = Workload(num_prompts=2)
    prompts = build_prompts(w, 100, api="chat", seed=0, calibration=TextCalibration(overhead=8, per_word=1))
    assert all(p.text is not None and len(p.text.split()) == 92 for p in prompts)


def test_prompt_file_lines(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "p.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(o) for o in (
        {"prompt": "hello there"}, {"prompt_token_ids": [1, 2]},
        {"messages": [{"role": "user", "content": "x"}]},
    )))
    w = Workload.model_validate({"num_prompts": 4, "prompt": {"file": str(path)}})
    prompts = build_prompts(w, 10, api="completions", seed=0)
    assert [p.text for p in prompts] == ["hello there", None, None, "hello there"]
    assert prompts[1].token_ids == (1, 2)
