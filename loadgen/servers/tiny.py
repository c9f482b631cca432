"""The ``tiny`` model: a Qwen2-architecture checkpoint with random weights, made locally.

Nothing is downloaded: a byte-level BPE tokenizer is trained on a seeded synthetic corpus
and the weights are drawn from a seeded normal distribution, then written in Hugging Face
format (``config.json``, ``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``,
``generation_config.json``). The result loads in vLLM (CPU build), in loadgen's transformers
engine and in ``AutoModelForCausalLM`` / ``AutoTokenizer``. It is generated once into the
cache directory and reused; the directory name carries a format version.

The shape is the smallest that the engines accept: vLLM's CPU attention needs head_dim >= 32.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy only where the model is written: every loadgen command reads tiny_path
    import numpy as np

from loadgen.workload.words import WORDS

VERSION = "v1"
NAME = f"tiny-qwen2-{VERSION}"
SEED = 0
VOCAB_SIZE = 8192
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
HIDDEN = 128
HEADS = 4  # head_dim 32
KV_HEADS = 2
LAYERS = 2
INTERMEDIATE = 384
MAX_POSITIONS = 4096
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_SYLLABLES = tuple(
    c + v for c in ("", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "st", "th")
    for v in ("a", "e", "i", "o", "u", "ai", "ou", "er", "an", "on")
)


def cache_root() -> Path:
    """``$LOADGEN_CACHE``, else ``$XDG_CACHE_HOME/loadgen``, else ``~/.cache/loadgen``."""
    if env := os.environ.get("LOADGEN_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "loadgen"


def tiny_path() -> Path:
    return cache_root() / "models" / NAME


def ensure_tiny() -> Path:
    """The cached tiny model, generated on first use (a few seconds)."""
    path = tiny_path()
    if (path / "model.safetensors").exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{NAME}-", dir=path.parent))
    try:
        write_tiny(tmp)
        tmp.chmod(0o755)
        for f in tmp.iterdir():
            f.chmod(0o644)
        try:
            tmp.rename(path)  # atomic: a concurrent first use keeps whichever finished first
        except OSError:
            if not (path / "model.safetensors").exists():
                raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(tmp)
    return path


def _corpus(rng: np.random.Generator, words: int = 200_000) -> list[str]:
    """Lines of pseudo-words: enough distinct pairs for BPE to fill the vocabulary."""
    import numpy as np

    syllables = np.array(_SYLLABLES)
    lengths = rng.integers(1, 5, size=words)
    picks = rng.integers(0, len(syllables), size=int(lengths.sum()))
    out: list[str] = []
    line: list[str] = []
    i = 0
    for n in lengths:
        line.append("".join(syllables[picks[i:i + n]]))
        i += n
        if len(line) == 16:
            out.append(" ".join(line))
            line = []
    out.append(" ".join(WORDS))  # the words text prompts are made of stay whole tokens
    out.extend(" ".join(WORDS) for _ in range(50))
    return out


def train_tokenizer(rng: np.random.Generator) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(rng), trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"tiny tokenizer: trained {tok.get_vocab_size()} tokens, expected {VOCAB_SIZE}")
    return tok


def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    import numpy as np

    head_dim = HIDDEN // HEADS

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    w = {"model.embed_tokens.weight": normal(VOCAB_SIZE, HIDDEN), "model.norm.weight": np.ones(HIDDEN, np.float32)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w |= {
            p + "input_layernorm.weight": np.ones(HIDDEN, np.float32),
            p + "post_attention_layernorm.weight": np.ones(HIDDEN, np.float32),
            p + "self_attn.q_proj.weight": normal(HEADS * head_dim, HIDDEN),
            p + "self_attn.q_proj.bias": np.zeros(HEADS * head_dim, np.float32),
            p + "self_attn.k_proj.weight": normal(KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.k_proj.bias": np.zeros(KV_HEADS * head_dim, np.float32),
            p + "self_attn.v_proj.weight": normal(KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.v_proj.bias": np.zeros(KV_HEADS * head_dim, np.float32),
            p + "self_attn.o_proj.weight": normal(HIDDEN, HEADS * head_dim),
            p + "mlp.gate_proj.weight": normal(INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": normal(INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": normal(HIDDEN, INTERMEDIATE),
        }
    return w


def write_tiny(out: Path) -> None:
    """Write the whole checkpoint into ``out`` (deterministic for a given ``VERSION``)."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(SEED)
    tok = train_tokenizer(rng)
    tok.save(str(out / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    im_end = tok.token_to_id("<|im_end|>")
    config = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": True, "torch_dtype": "float32", "use_cache": True,
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": LAYERS,
        "attention_dropout": 0.0, "initializer_range": 0.02, "bos_token_id": eos, "eos_token_id": im_end,
    }
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": MAX_POSITIONS,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None, "unk_token": None,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    generation = {"bos_token_id": eos, "eos_token_id": [im_end, eos], "pad_token_id": eos, "do_sample": False}
    for name, data in (
        ("config.json", config), ("tokenizer_config.json", tok_config), ("generation_config.json", generation),
        ("special_tokens_map.json", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    ):
        (out / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    save_file(_weights(rng), str(out / "model.safetensors"), metadata={"format": "pt"})
