"""loadgen's transformers engine: an OpenAI-compatible server on Hugging Face transformers.

``python -m loadgen.servers.hfserve --model PATH`` (what ``loadgen serve MODEL --backend transformers``
runs). It serves ``/v1/completions`` and ``/v1/chat/completions`` (streamed or whole),
``/health``, ``/v1/models``, ``/version`` and ``/metrics``, with what a benchmark needs and
``transformers serve`` lacks: token-id prompts, ``ignore_eos`` / ``min_tokens`` (exact output
length), the usage chunk (and per-chunk usage with ``continuous_usage_stats``), ``[DONE]``, and
the model's peak allocated memory on ``/metrics`` (``POST /reset_peak_memory`` starts a new
peak). The attention implementation is chosen at start (``--attn-implementation``: ``sdpa``,
``eager``, ``flash_attention_2``), as in the reference tables' "w/wo FA2" rows.

Requests are generated one at a time in arrival order (batch size 1, as the reference speed
tables measure transformers); a request waiting its turn counts that wait in its TTFT. Each
token is decoded with the key-value cache and sent as its own chunk.
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import resource
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import orjson
from prometheus_client.metrics_core import Metric

from loadgen.data import RequestBody
from loadgen.scenario.serve import Attention, GradMode, LoadIn
from loadgen.servers.openai.app import OpenAIApp, Route, counter, gauge
from loadgen.servers.openai.asgi import ASGIScope, end_stream, read_body, respond, run_uvicorn, send_event, start_stream
from loadgen.servers.openai.protocol import (
    StreamOptions,
    error,
    max_tokens_of,
    object_name,
    request_body,
    usage,
    whole_answer,
)


@dataclass(slots=True)
class Job:
    """One request for the generation thread; events go back through ``emit``."""

    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int
    ignore_eos: bool
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    seed: int | None
    stop: tuple[str, ...]
    emit: Any  # callable(kind, payload), thread-safe
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass(slots=True)
class Stats:
    requests_total: int = 0
    requests_completed: int = 0
    requests_waiting: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0


class Runner:
    """One generation thread taking jobs in arrival order; an engine says how it generates one
    (``_generate``) and what it is (``versions``, memory, ``vocab_size``, ``tokenizer``)."""

    tokenizer: Any
    max_model_len: int
    vocab_size: int
    model_bytes: int
    attn: str
    dtype: str
    device: Any  # has .type: "cpu" or "cuda"

    def start(self) -> None:
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.stats = Stats()
        self.thread = threading.Thread(target=self._loop, name="generate", daemon=True)
        self.thread.start()

    def versions(self) -> dict[str, str]:
        raise NotImplementedError

    def peak_allocated_bytes(self) -> int:
        """The process's peak RSS (an engine on a GPU says otherwise)."""
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def reset_peak(self) -> None:
        pass

    def _generate(self, job: Job) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            self.stats.requests_waiting -= 1
            try:
                self._generate(job)
            except Exception as exc:  # noqa: BLE001 - reported to the client, the engine lives on
                job.emit("error", f"{type(exc).__name__}: {exc}")

    def submit(self, job: Job) -> None:
        self.stats.requests_waiting += 1
        self.jobs.put(job)


class ModelRunner(Runner):
    """A transformers model, its tokenizer and the single generation thread."""

    def __init__(self, model: str, *, dtype: str, attn: str, device: str, max_model_len: int | None,
                 load_in: str | None = None, grad_mode: str = "inference_mode") -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.tokenizer: Any = AutoTokenizer.from_pretrained(model)
        kwargs: dict[str, object] = {"attn_implementation": attn}
        if dtype != "auto":
            kwargs["dtype"] = getattr(torch, dtype)
        if load_in is not None:  # bitsandbytes quantizes the weights as they load (GPU only)
            import transformers

            bnb: Any = transformers.BitsAndBytesConfig
            compute = getattr(torch, dtype) if dtype != "auto" else torch.bfloat16
            kwargs["quantization_config"] = bnb(
                load_in_8bit=load_in == "8bit", load_in_4bit=load_in == "4bit", bnb_4bit_compute_dtype=compute,
            )
            kwargs["device_map"] = {"": 0}
        self.load_in, self.grad_mode = load_in, grad_mode
        gpus = torch.cuda.device_count() if self.device.type == "cuda" else 0
        for i in range(gpus):
            torch.cuda.reset_peak_memory_stats(i)
        if gpus > 1:  # layers spread over every visible GPU, as the reference tables' multi-GPU rows
            kwargs["device_map"] = "auto"
            self.device = torch.device("cuda:0")  # where the embeddings, so the inputs, live
        loaded: Any = AutoModelForCausalLM.from_pretrained(model, **kwargs)
        placed = gpus > 1 or load_in is not None  # device_map put it already
        self.model: Any = (loaded if placed else loaded.to(self.device)).eval()
        self.gpus = gpus
        self.attn = attn
        self.dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        self.model_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        cfg = self.model.config
        self.max_model_len = max_model_len or int(getattr(cfg, "max_position_embeddings", 4096))
        eos = self.model.generation_config.eos_token_id
        eos_ids = eos if isinstance(eos, list) else [eos]
        if self.tokenizer.eos_token_id is not None:
            eos_ids.append(self.tokenizer.eos_token_id)
        self.eos = frozenset(int(e) for e in eos_ids if e is not None)
        self.vocab_size = int(cfg.vocab_size)
        self.start()

    def versions(self) -> dict[str, str]:
        import transformers

        from loadgen import __version__

        return {
            "version": f"loadgen-transformers {__version__}", "transformers": transformers.__version__,
            "torch": self.torch.__version__, "attn_implementation": self.attn, "dtype": self.dtype,
            "device": str(self.device), "load_in": self.load_in or "", "grad_mode": self.grad_mode,
        }

    # -- memory ---------------------------------------------------------------------------
    def peak_allocated_bytes(self) -> int:
        """Peak memory the model allocated: CUDA's allocator on a GPU, the process's peak RSS on CPU."""
        if self.gpus:  # summed over the GPUs the model spans
            return sum(int(self.torch.cuda.max_memory_allocated(i)) for i in range(self.gpus))
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def reset_peak(self) -> None:
        for i in range(self.gpus):
            self.torch.cuda.reset_peak_memory_stats(i)

    # -- generation -----------------------------------------------------------------------
    def _pick(self, logits: Any, job: Job, seen: Any, generator: Any, generated: int) -> int:
        torch = self.torch
        logits = logits.float()
        if job.repetition_penalty != 1.0:
            prev = logits[seen]
            logits[seen] = torch.where(prev > 0, prev / job.repetition_penalty, prev * job.repetition_penalty)
        if generated < job.min_tokens or job.ignore_eos:  # exact output length
            logits[list(self.eos)] = float("-inf")
        if job.temperature <= 0:
            return int(torch.argmax(logits))
        logits = logits / job.temperature
        if 0 < job.top_k < logits.numel():
            kth = torch.topk(logits, job.top_k).values[-1]
            logits[logits < kth] = float("-inf")
        probs = torch.softmax(logits, dim=-1)
        if job.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_probs, 0) - sorted_probs < job.top_p
            mask = torch.zeros_like(probs, dtype=torch.bool)
            mask[order[keep]] = True
            probs = torch.where(mask, probs, torch.zeros_like(probs))
            probs = probs / probs.sum()
        return int(torch.multinomial(probs, 1, generator=generator))

    def _generate(self, job: Job) -> None:
        torch = self.torch
        generator = None
        if job.seed is not None:
            generator = torch.Generator(device="cpu").manual_seed(job.seed)
        ids = torch.tensor([job.prompt_ids], device=self.device)
        seen = torch.tensor(job.prompt_ids, dtype=torch.long)
        cache = None
        out: list[int] = []
        text = ""
        with torch.inference_mode() if self.grad_mode == "inference_mode" else torch.no_grad():
            while True:
                if job.cancelled.is_set():
                    return
                result = self.model(input_ids=ids, past_key_values=cache, use_cache=True)
                cache = result.past_key_values
                token = self._pick(result.logits[0, -1].to("cpu"), job, seen, generator, len(out))
                out.append(token)
                seen = torch.cat([seen, torch.tensor([token])])
                self.stats.generation_tokens_total += 1
                full = str(self.tokenizer.decode(out, skip_special_tokens=True))
                # hold back a partial UTF-8 sequence until its last byte arrives
                delta = "" if full.endswith("\ufffd") else full[len(text):]
                text += delta
                finish = None
                if token in self.eos and not job.ignore_eos:
                    finish = "stop"
                elif job.stop and not job.ignore_eos and (hit := next((x for x in job.stop if x in text), None)):
                    cut = text.index(hit)
                    delta = delta[: max(0, len(delta) - (len(text) - cut))]
                    finish = "stop"
                elif len(out) >= job.max_tokens:
                    finish = "length"
                # the token leaves now, with finish_reason on the last one: no chunk waits for the next
                job.emit("token", (delta, len(out), finish))
                if finish is not None:
                    return
                ids = torch.tensor([[token]], device=self.device)



class TransformersApp(OpenAIApp):
    """The ASGI application in front of ``ModelRunner``: the shared OpenAI routes, plus ``/version``
    and ``POST /reset_peak_memory``."""

    def __init__(self, runner: Runner, served_name: str) -> None:
        super().__init__(served_name, runner.max_model_len)
        self.runner = runner
        self.name = served_name

    def routes(self) -> dict[tuple[str, str], Route]:
        return {("GET", "/version"): self._version, ("POST", "/reset_peak_memory"): self._reset_peak}

    async def _version(self, receive: Any, send: Any) -> None:
        await respond(send, 200, orjson.dumps(self.runner.versions()))

    async def _reset_peak(self, receive: Any, send: Any) -> None:
        await read_body(receive)
        self.runner.reset_peak()
        await respond(send, 200, b"")

    def metric_families(self) -> Iterable[Metric]:
        e, s = self.runner, self.runner.stats
        dev = e.device.type
        yield gauge(
            "loadgen_engine_peak_allocated_bytes",
            "peak memory allocated by the model (CUDA allocator on a GPU, process peak RSS on CPU)",
            e.peak_allocated_bytes(), {"device": dev},
        )
        yield gauge("loadgen_engine_model_bytes", "bytes of the model's parameters and buffers", e.model_bytes)
        yield gauge("loadgen_engine_info", "how the model runs", 1,
                    {"attn_implementation": e.attn, "dtype": str(e.dtype), "device": dev})
        yield counter("loadgen_engine_requests", "requests received", s.requests_total)
        yield counter("loadgen_engine_requests_completed", "requests answered in full", s.requests_completed)
        yield gauge("loadgen_engine_requests_waiting", "requests queued behind the one generating", s.requests_waiting)
        yield counter("loadgen_engine_prompt_tokens", "prompt tokens of the requests", s.prompt_tokens_total)
        yield counter("loadgen_engine_generation_tokens", "output tokens generated", s.generation_tokens_total)

    def _prompt_ids(self, body: RequestBody, chat: bool) -> list[int]:
        tok = self.runner.tokenizer
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ValueError("'messages' must be a non-empty list")
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return list(tok.encode(text, add_special_tokens=False))
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            vocab = self.runner.vocab_size
            if any(t < 0 or t >= vocab for t in prompt):
                raise ValueError(f"token ids must be in [0, {vocab})")
            return list(prompt)
        if isinstance(prompt, str) and prompt:
            return list(tok(prompt).input_ids)
        raise ValueError("'prompt' must be a non-empty string or list of token ids")

    def _job(self, body: RequestBody, prompt_ids: list[int], emit: Any) -> Job:
        max_tokens = max_tokens_of(body)
        if len(prompt_ids) + max_tokens > self.runner.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds "
                f"max_model_len {self.runner.max_model_len}"
            )
        if int(body.get("n") or 1) != 1:
            raise ValueError("only n=1 is supported")
        stop = body.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop)
        seed = body.get("seed")
        return Job(
            prompt_ids=prompt_ids, max_tokens=max_tokens, min_tokens=min(int(body.get("min_tokens") or 0), max_tokens),
            ignore_eos=bool(body.get("ignore_eos")), temperature=float(body.get("temperature", 1.0) or 0.0),
            top_p=float(body.get("top_p") or 1.0), top_k=int(body.get("top_k") or 0),
            repetition_penalty=float(body.get("repetition_penalty") or 1.0),
            seed=None if seed is None else int(seed), stop=stop, emit=emit,
        )

    async def complete(self, scope: ASGIScope, receive: Any, send: Any, *, chat: bool) -> None:
        raw = await read_body(receive)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def emit(kind: str, payload: Any) -> None:
            loop.call_soon_threadsafe(events.put_nowait, (kind, payload))

        self.runner.stats.requests_total += 1
        try:
            body = request_body(raw)
            prompt_ids = self._prompt_ids(body, chat)
            job = self._job(body, prompt_ids, emit)
        except (ValueError, TypeError) as exc:
            await respond(send, 400, error(str(exc)))
            return
        self.runner.stats.prompt_tokens_total += len(prompt_ids)
        self.runner.submit(job)
        try:
            if body.get("stream"):
                await self._stream(send, body, chat, events, len(prompt_ids))
            else:
                await self._whole(send, chat, events, len(prompt_ids))
        finally:
            job.cancelled.set()  # a client that went away stops the generation

    async def _whole(self, send: Any, chat: bool, events: asyncio.Queue[tuple[str, Any]], n_prompt: int) -> None:
        parts: list[str] = []
        while True:
            kind, payload = await events.get()
            if kind == "error":
                await respond(send, 500, error(payload, "InternalServerError", 500))
                return
            delta, n_out, finish = payload
            parts.append(delta)
            if finish is not None:
                break
        self.runner.stats.requests_completed += 1
        await respond(send, 200, whole_answer(
            chat=chat, id_=f"cmpl-{uuid.uuid4().hex}", created=int(time.time()), model=self.name,
            text="".join(parts), finish=finish, prompt_tokens=n_prompt, completion_tokens=n_out,
        ))

    async def _stream(
        self, send: Any, body: RequestBody, chat: bool, events: asyncio.Queue[tuple[str, Any]], n_prompt: int
    ) -> None:
        options = StreamOptions.of(body)
        include_usage, continuous = options.include_usage, options.continuous
        base: dict[str, object] = {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": object_name(chat, streamed=True),
            "created": int(time.time()), "model": self.name,
        }
        await start_stream(send)
        if chat:
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            await send_event(send, orjson.dumps(base | {"choices": [role]}))
        n_out = 0
        while True:
            kind, payload = await events.get()
            if kind == "error":
                await send_event(send, error(payload, "InternalServerError", 500))
                await end_stream(send)
                return
            delta, n_out, finish = payload
            if chat:
                choice: dict[str, object] = {"index": 0, "delta": {"content": delta}, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}
            chunk = base | {"choices": [choice]}
            if continuous:
                chunk["usage"] = usage(n_prompt, n_out)
            await send_event(send, orjson.dumps(chunk))
            if finish is not None:
                break
        if include_usage:
            await send_event(send, orjson.dumps(base | {"choices": [], "usage": usage(n_prompt, n_out)}))
        self.runner.stats.requests_completed += 1
        await end_stream(send)


def engine_parser(module: str, doc: str) -> argparse.ArgumentParser:
    """The options every loadgen engine takes: --served-model-name, --host, --port, --max-model-len."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0])
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-model-len", type=int, default=None)
    return parser


def serve_runner(runner: Runner, name: str, host: str, port: int, about: str) -> None:
    """Say what is served (the engine's log), then serve it until SIGINT / SIGTERM."""
    print(f"{about} as {name!r}, max_model_len {runner.max_model_len}", file=sys.stderr, flush=True)
    run_uvicorn(TransformersApp(runner, name), host, port)


def parser() -> argparse.ArgumentParser:
    """The engine's command line (what ``loadgen serve --backend transformers`` launches)."""
    parser = engine_parser("loadgen.servers.hfserve", __doc__ or "")
    parser.add_argument("--model", required=True, help="local path or hub id")
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"))
    parser.add_argument("--attn-implementation", default="sdpa", choices=get_args(Attention))
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--load-in", default=None, choices=get_args(LoadIn), help="bitsandbytes weights (GPU)")
    parser.add_argument("--grad-mode", default="inference_mode", choices=get_args(GradMode))
    return parser


def main(argv: list[str] | None = None) -> None:
    parser_ = parser()
    args = parser_.parse_args(argv)
    if args.load_in is not None:
        import importlib.util

        if importlib.util.find_spec("bitsandbytes") is None:
            parser_.error(f"--load-in {args.load_in}: needs bitsandbytes (pip install bitsandbytes) and a CUDA GPU")
    runner = ModelRunner(args.model, dtype=args.dtype, attn=args.attn_implementation, device=args.device,
                         max_model_len=args.max_model_len, load_in=args.load_in, grad_mode=args.grad_mode)
    serve_runner(runner, args.served_model_name or Path(args.model).name, args.host, args.port,
                 f"transformers engine: {args.model} on {runner.device} ({runner.dtype}, {args.attn_implementation})")


if __name__ == "__main__":
    main()
