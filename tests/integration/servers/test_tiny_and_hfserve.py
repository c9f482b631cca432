"""The tiny model loads where the issue says it must, and loadgen's transformers engine serves
what a benchmark needs: exact lengths, token-id prompts, usage, errors, peak memory."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from loadgen.engines.build import build_spec, engine_options, launch_spec
from loadgen.servers.launch import LaunchedServer, free_port
from loadgen.servers.tiny import HEADS, HIDDEN, VOCAB_SIZE, ensure_tiny, write_tiny
from loadgen.workload.words import WORDS


@pytest.mark.engines
def test_tiny_loads_in_auto_classes_and_is_deterministic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("LOADGEN_CACHE", str(tmp_path / "cache"))
    path = ensure_tiny()
    assert path == tmp_path / "cache" / "models" / "tiny-qwen2-v1"
    assert ensure_tiny() == path  # cached: the second call makes nothing
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    assert model.config.model_type == "qwen2"
    assert model.config.hidden_size // model.config.num_attention_heads == HIDDEN // HEADS >= 32  # vLLM CPU
    assert len(tok) == VOCAB_SIZE == model.config.vocab_size
    # the words text prompts are made of are one token each, with their leading space
    assert all(len(tok.encode(" " + w, add_special_tokens=False)) == 1 for w in WORDS)
    text = tok.apply_chat_template([{"role": "user", "content": "the world"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nthe world<|im_end|>\n<|im_start|>assistant\n"
    out = model.generate(torch.tensor([[1000, 2000, 3000]]), max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert out.shape == (1, 7)
    # the same version is the same bytes, wherever it is made
    again = tmp_path / "again"
    again.mkdir()
    write_tiny(again)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert hashlib.sha256((again / name).read_bytes()).digest() == hashlib.sha256((path / name).read_bytes()).digest()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("transformers")
    spec = build_spec(engine_options("tiny", backend="transformers", device="cpu", port=free_port()))
    ensure_tiny()
    server = LaunchedServer(launch_spec(spec), tmp_path_factory.mktemp("hf") / "engine.log")
    yield server.start()
    server.stop()


def stream(base: str, path: str, body: dict[str, object]) -> list[dict[str, object]]:
    with httpx.Client(timeout=60) as http, http.stream("POST", base + path, json=body | {"stream": True}) as r:
        assert r.status_code == 200
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [orjson.loads(d) for d in data[:-1]]


@pytest.mark.engines
def test_token_ids_exact_length_and_per_chunk_usage(engine: str) -> None:
    events = stream(engine, "/completions", {
        "model": "tiny", "prompt": [1000 + i for i in range(17)], "max_tokens": 9, "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    })
    tokens = [e for e in events if e["choices"]]
    assert len(tokens) == 9
    assert [e["usage"]["completion_tokens"] for e in tokens] == list(range(1, 10))  # type: ignore[index]
    assert [e["choices"][0]["finish_reason"] for e in tokens] == [None] * 8 + ["length"]  # type: ignore[index]
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == {"prompt_tokens": 17, "completion_tokens": 9, "total_tokens": 26}


@pytest.mark.engines
def test_whole_chat_response_and_min_tokens(engine: str) -> None:
    r = httpx.post(engine + "/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": "the world"}], "max_tokens": 5, "min_tokens": 5,
    })
    body = r.json()
    assert r.status_code == 200
    assert body["object"] == "chat.completion"
    assert body["usage"]["completion_tokens"] == 5
    # <|im_start|> u ser \n the _world <|im_end|> \n <|im_start|> a s sist ant \n: 14 tiny-vocabulary tokens
    assert body["usage"]["prompt_tokens"] == 14


@pytest.mark.engines
def test_bad_requests_are_400_and_the_engine_lives_on(engine: str) -> None:
    too_long = httpx.post(engine + "/completions", timeout=60, json={"prompt": [1000] * 4000, "max_tokens": 200})
    assert too_long.status_code == 400
    assert "exceeds max_model_len 4096" in too_long.json()["error"]["message"]  # vLLM's error body
    bad_id = httpx.post(engine + "/completions", timeout=60, json={"prompt": [VOCAB_SIZE], "max_tokens": 2})
    assert bad_id.status_code == 400
    assert httpx.get(engine.removesuffix("/v1") + "/health").status_code == 200


@pytest.mark.engines
def test_metrics_report_peak_memory_and_counts(engine: str) -> None:
    text = httpx.get(engine.removesuffix("/v1") + "/metrics").text
    values = {line.split("{")[0].split(" ")[0]: float(line.rsplit(" ", 1)[1])
              for line in text.splitlines() if line and not line.startswith("#")}
    assert values["loadgen_engine_model_bytes"] == 5_771_776  # 1,442,944 float32 parameters, by hand below
    assert values["loadgen_engine_peak_allocated_bytes"] > values["loadgen_engine_model_bytes"]
    assert 'attn_implementation="sdpa"' in text


def test_parameter_count_by_hand() -> None:
    h, i, v, layers, kv = 128, 384, 8192, 2, 64
    per_layer = 2 * h + (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i
    assert v * h + h + layers * per_layer == 5_771_776 // 4
