"""loadgen's CTranslate2 engine: CTranslate2 has no HTTP server, so loadgen serves its
``Generator`` through the same OpenAI server side as its transformers engine.

``python -m loadgen.servers.ct2serve --model CT2_DIR --tokenizer HF_DIR --compute-type int8``
(what ``loadgen serve MODEL --backend ctranslate2 --quant int8`` runs, after converting the
Hugging Face checkpoint once with CTranslate2's converter into loadgen's cache). Tokens stream
from ``Generator.generate_tokens`` one request at a time in arrival order, as the transformers
engine does; ``ignore_eos`` / ``min_tokens`` become ``min_length``, so the output length is exact.
The compute type (``int8``, ``int8_float16``, ``int8_bfloat16``, ``float16``, ``bfloat16``,
``float32``) is the quantization; ``default`` (without ``--quant``) keeps the model's own precision.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

from loadgen.servers.hfserve import Job, Runner, engine_parser, serve_runner

# "default": the precision the model was converted with (CTranslate2's own default)
COMPUTE_TYPES = ("default", "int8", "int8_float16", "int8_bfloat16", "int8_float32", "float16", "bfloat16", "float32")


def convert(checkpoint: str, out: Path) -> Path:
    """The Hugging Face checkpoint in CTranslate2's format (float32 weights; the compute type
    is chosen when the model is loaded)."""
    from ctranslate2.converters import TransformersConverter

    tmp = out.with_name(f"{out.name}.{os.getpid()}.part")  # two loadgens converting at once keep apart
    try:
        TransformersConverter(checkpoint, low_cpu_mem_usage=True).convert(str(tmp), force=True)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "model.bin").is_file():  # not another conversion that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


class CT2Runner(Runner):
    """A CTranslate2 generator, the checkpoint's tokenizer, and the generation thread."""

    def __init__(self, model: str, tokenizer: str, *, compute_type: str, device: str, threads: int,
                 max_model_len: int | None) -> None:
        import ctranslate2
        from transformers import AutoConfig, AutoTokenizer

        self.ct2 = ctranslate2
        self.generator: Any = ctranslate2.Generator(model, device=device, compute_type=compute_type,
                                                    intra_threads=threads)
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        cfg = AutoConfig.from_pretrained(tokenizer)
        self.vocab_size = int(cfg.vocab_size)
        self.max_model_len = max_model_len or int(getattr(cfg, "max_position_embeddings", 4096))
        self.attn = "ctranslate2"
        self.dtype = str(getattr(self.generator, "compute_type", compute_type))  # "default" resolved
        self.device = type("Device", (), {"type": device})()
        self.model_bytes = sum(f.stat().st_size for f in Path(model).glob("*.bin"))
        self.start()

    def versions(self) -> dict[str, str]:
        from loadgen import __version__

        return {"version": f"loadgen-ctranslate2 {__version__}", "ctranslate2": self.ct2.__version__,
                "compute_type": self.dtype, "device": self.device.type}

    def _generate(self, job: Job) -> None:
        tokens = self.tokenizer.convert_ids_to_tokens(job.prompt_ids)
        exact = job.max_tokens if job.ignore_eos else job.min_tokens
        sampling = {"sampling_topk": 1} if job.temperature <= 0 else {
            "sampling_topk": job.top_k or 0, "sampling_topp": job.top_p, "sampling_temperature": job.temperature,
        }
        out: list[int] = []
        text = ""
        steps = self.generator.generate_tokens(
            tokens, max_length=job.max_tokens, min_length=exact, repetition_penalty=job.repetition_penalty,
            **sampling,
        )
        try:
            for step in steps:
                if job.cancelled.is_set():
                    return
                out.append(int(step.token_id))
                self.stats.generation_tokens_total += 1
                full = str(self.tokenizer.decode(out, skip_special_tokens=True))
                delta = "" if full.endswith("\ufffd") else full[len(text):]
                text += delta
                finish = None
                if step.is_last or len(out) >= job.max_tokens:
                    finish = "length" if len(out) >= job.max_tokens else "stop"
                job.emit("token", (delta, len(out), finish))
                if finish is not None:
                    return
        finally:
            steps.close()


def parser() -> argparse.ArgumentParser:
    """The engine's command line (what ``loadgen serve --backend ctranslate2`` launches)."""
    parser = engine_parser("loadgen.servers.ct2serve", __doc__ or "")
    parser.add_argument("--model", required=True, help="a CTranslate2 model directory")
    parser.add_argument("--tokenizer", required=True, help="the Hugging Face checkpoint it was converted from")
    parser.add_argument("--compute-type", default="int8", choices=COMPUTE_TYPES)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: CTranslate2's default)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    runner = CT2Runner(args.model, args.tokenizer, compute_type=args.compute_type, device=args.device,
                       threads=args.threads, max_model_len=args.max_model_len)
    serve_runner(runner, args.served_model_name or Path(args.tokenizer).name, args.host, args.port,
                 f"CTranslate2 engine: {args.model} on {args.device} ({args.compute_type})")

if __name__ == "__main__":
    main()
