"""``vllm bench serve``'s flags -> a loadgen scenario.

The flags people use are taken with vLLM's defaults (1000 prompts, the random dataset at
1024 in / 128 out, rate inf, no concurrency cap, seed 0, no warmup, ignore_eos off, min_tokens
never sent); a vLLM flag loadgen does not take is a one-line error naming it, and one that
changes nothing it measures is taken and said to be ignored.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any, NoReturn

from loadgen.data import Unchecked
from loadgen.errors import UsageError

# vllm bench serve flags loadgen does not take (their features are vLLM-specific or unused here)
NOT_TAKEN = (
    "--no-stream", "--no-oversample", "--skip-chat-template", "--enable-multimodal-chat",
    "--custom-ensure-client-side-data", "--spec-bench-output-len", "--spec-bench-category", "--self-timed",
    "--timed-trace-chunk-hash-size", "--timed-trace-sec-multiplier", "--blazedit-min-distance",
    "--blazedit-max-distance", "--asr-max-audio-len-sec", "--asr-min-audio-len-sec", "--random-batch-size",
    "--no-reranker", "--random-mm-base-items-per-request", "--random-mm-num-mm-items-range-ratio",
    "--random-mm-limit-mm-per-prompt", "--random-mm-bucket-config", "--bfcl-categories",
    "--speed-bench-dataset-subset", "--speed-bench-output-len", "--speed-bench-category",
    "--use-beam-search", "--profile",
    "--lora-modules", "--lora-assignment", "--skip-tokenizer-init",
    "--timeline-itl-thresholds", "--plot-dataset-stats", "--log-config-file",
)


# vllm bench serve flags that change nothing loadgen measures: taken, and said to be ignored
IGNORED = {
    "--trust-remote-code": "loadgen's tokenizer never runs a model's code",
    "--tokenizer-mode": "loadgen reads the tokenizer with its default mode",
    "--plot-timeline": "loadgen report RUN --plot draws the run's timeline",
    "--probe-request-rate": "the search for the most load within SLOs is loadgen run --search",
    "--logprobs": "loadgen does not ask for log-probabilities",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"loadgen bench serve: {message}")


# what each flag does, as `loadgen bench serve --help` says it (vLLM's meaning, loadgen's measuring)
HELP: dict[str, str] = {
    "--backend": "API to send: openai / vllm (completions) or openai-chat / vllm-chat (chat)",
    "--base-url": "server's base URL, e.g. http://127.0.0.1:8000 (else --host and --port)",
    "--host": "server's host (with --port, when --base-url is not given)",
    "--port": "server's port",
    "--endpoint": "path of the API (default: /v1/completions or /v1/chat/completions)",
    "--model": "model id to send (default: the server's first model)",
    "--served-model-name": "model id the server serves, when it differs from --model",
    "--tokenizer": "tokenizer that counts a dataset's lengths (name or directory)",
    "--dataset-name": "where prompts come from: random, sharegpt, custom (JSONL), prefix_repetition or hf",
    "--dataset-path": "the dataset's file (sharegpt, custom) or directory (hf)",
    "--disable-shuffle": "send a dataset's entries in file order",
    "--num-prompts": "requests to send",
    "--input-len": "prompt tokens (random dataset; same as --random-input-len)",
    "--output-len": "output tokens (random dataset; same as --random-output-len)",
    "--random-input-len": "prompt tokens of the random dataset",
    "--random-output-len": "output tokens of the random dataset",
    "--random-range-ratio": "spread lengths uniformly within this share around the mean",
    "--random-prefix-len": "tokens of a prefix every random prompt shares",
    "--sharegpt-output-len": "output tokens for every ShareGPT entry (default: its answer's length)",
    "--custom-output-len": "output tokens for every custom (JSONL) prompt",
    "--prefix-repetition-prefix-len": "tokens of each shared prefix (prefix_repetition)",
    "--prefix-repetition-suffix-len": "tokens after the prefix, each request's own (prefix_repetition)",
    "--prefix-repetition-num-prefixes": "distinct prefixes, shared round-robin (prefix_repetition)",
    "--prefix-repetition-output-len": "output tokens (prefix_repetition)",
    "--hf-name": "Hugging Face dataset name (hf)",
    "--hf-split": "dataset split (hf)",
    "--hf-subset": "dataset subset (hf)",
    "--hf-output-len": "output tokens for every hf entry",
    "--request-rate": "requests per second (default inf: all at once, open loop)",
    "--burstiness": "gamma shape of the gaps between requests (1: Poisson)",
    "--max-concurrency": "most requests in flight at once",
    "--ramp-up-strategy": "raise the rate over the run: linear or exponential",
    "--ramp-up-start-rps": "rate at the start of the ramp",
    "--ramp-up-end-rps": "rate at the end of the ramp",
    "--num-warmups": "warmup requests before the measured ones",
    "--ignore-eos": "ask the server to generate past the end-of-sequence token",
    "--temperature": "sampling temperature",
    "--top-p": "nucleus sampling's top p",
    "--top-k": "top k sampling",
    "--min-p": "min p sampling",
    "--frequency-penalty": "frequency penalty",
    "--presence-penalty": "presence penalty",
    "--repetition-penalty": "repetition penalty",
    "--extra-body": "JSON merged into every request's body",
    "--chat-template-kwargs": "JSON passed to the chat template (chat_template_kwargs)",
    "--header": "KEY=VALUE header on every request (repeatable)",
    "--goodput": "SLO KEY:MS for goodput, e.g. ttft:300 tpot:20 (repeatable)",
    "--percentile-metrics": "metrics whose percentiles are printed: ttft,tpot,itl,e2el",
    "--metric-percentiles": "percentiles printed, e.g. 50,90,99",
    "--seed": "seed of prompts and arrival times",
    "--save-result": "write the result JSON (and the run directory)",
    "--save-detailed": "with --save-result: per-request figures in the JSON",
    "--result-dir": "directory of the result JSON",
    "--result-filename": "file name of the result JSON",
    "--label": "label of the run in the result's name",
    "--metadata": "KEY=VALUE added to the result JSON (repeatable)",
    "--disable-tqdm": "no progress bar",
    "--save-scenario": "write the equivalent loadgen scenario to this file",
    "--out": "loadgen's run directory (default: none unless --save-result)",
    "--repeats": "loadgen's: run the benchmark N times, each with fresh prompts; the figures with 95%% intervals",
    "--append-result": "append the result to the result file (one JSON per line)",
    "--insecure": "do not verify the server's TLS certificate",
    "--request-id-prefix": "prefix of each request's X-Request-Id",
    "--ready-check-timeout-sec": "wait up to this many seconds for the server to be ready",
    # taken for vLLM's command lines and ignored, saying why
    **{flag: f"ignored: {why}" for flag, why in IGNORED.items()},
}


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="loadgen bench serve", add_help=False, allow_abbrev=False,
                usage="loadgen bench serve [vllm bench serve's flags]",
                description="vllm bench serve's command line, measured by loadgen.")

    def a(flag: str, **kw: Any) -> None:
        p.add_argument(flag, help=HELP[flag], **kw)
    a("--backend", choices=("openai", "openai-chat", "vllm", "vllm-chat"), default="openai")
    a("--base-url")
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=8000)
    a("--endpoint", default=None)
    a("--model")
    a("--served-model-name")
    a("--tokenizer")
    a("--dataset-name", choices=("random", "sharegpt", "custom", "prefix_repetition", "hf"), default="random")
    a("--dataset-path")
    a("--disable-shuffle", action="store_true")
    a("--num-prompts", type=int, default=1000)
    a("--input-len", type=int)
    a("--output-len", type=int)
    a("--random-input-len", type=int, default=1024)
    a("--random-output-len", type=int, default=128)
    a("--random-range-ratio", type=float, default=0.0)
    a("--random-prefix-len", type=int, default=0)
    a("--sharegpt-output-len", type=int)
    a("--custom-output-len", type=int, default=256)
    a("--prefix-repetition-prefix-len", type=int, default=256)
    a("--prefix-repetition-suffix-len", type=int, default=256)
    a("--prefix-repetition-num-prefixes", type=int, default=10)
    a("--prefix-repetition-output-len", type=int, default=128)
    a("--hf-name")
    a("--hf-split")
    a("--hf-subset")
    a("--hf-output-len", type=int)
    a("--request-rate", type=float, default=float("inf"))
    a("--burstiness", type=float, default=1.0)
    a("--max-concurrency", type=int)
    a("--ramp-up-strategy", choices=("linear", "exponential"))
    a("--ramp-up-start-rps", type=int)
    a("--ramp-up-end-rps", type=int)
    a("--num-warmups", type=int, default=0)
    a("--ignore-eos", action="store_true")
    a("--temperature", type=float)
    a("--top-p", type=float)
    a("--top-k", type=int)
    a("--min-p", type=float)
    a("--frequency-penalty", type=float)
    a("--presence-penalty", type=float)
    a("--repetition-penalty", type=float)
    a("--extra-body")
    a("--chat-template-kwargs")
    a("--header", nargs="+", default=[])
    a("--goodput", nargs="+", default=[])
    a("--percentile-metrics", default="ttft,tpot,itl")
    a("--metric-percentiles", default="99")
    a("--seed", type=int, default=0)
    a("--save-result", action="store_true")
    a("--save-detailed", action="store_true")
    a("--result-dir")
    a("--result-filename")
    a("--label")
    a("--metadata", nargs="+", default=[])
    a("--disable-tqdm", action="store_true")
    a("--save-scenario")
    a("--out")
    a("--repeats", type=int, default=1)
    a("--append-result", action="store_true")
    a("--trust-remote-code", action="store_true")
    a("--plot-timeline", action="store_true")
    a("--insecure", action="store_true")
    a("--request-id-prefix")
    a("--ready-check-timeout-sec", type=int, default=0)
    for flag in ("--tokenizer-mode", "--probe-request-rate", "--logprobs"):
        a(flag)
    return p


def ignored(argv: list[str]) -> list[str]:
    """The vLLM flags given that loadgen takes and ignores, each with why."""
    given = {arg.split("=", 1)[0] for arg in argv}
    return [f"{flag} ignored: {why}" for flag, why in IGNORED.items() if flag in given]


@dataclass(frozen=True, slots=True)
class BenchArgs:
    ns: argparse.Namespace
    scenario: Unchecked  # the equivalent scenario, as YAML data
    base_url: str
    percentile_metrics: list[str]
    percentiles: list[float]
    goodput: dict[str, float]
    metadata: dict[str, str]  # --metadata KEY=VALUE, added to the result JSON


def _json(flag: str, text: str | None) -> Unchecked:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise UsageError(
            f"{flag}: not valid JSON ({text[:80]!r}); give an object, e.g. {flag} '{{\"top_k\": 20}}'"
        ) from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag}: give a JSON object, e.g. {flag} '{{\"top_k\": 20}}'")
    return value


def _pairs(flag: str, items: list[str], sep: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, found, value = item.partition(sep)
        if not found or not key.strip():
            raise UsageError(f"{flag} {item!r}: expected KEY{sep}VALUE")
        out[key.strip()] = value.strip()
    return out


def parse(argv: list[str]) -> BenchArgs:
    """vLLM's flags -> the scenario loadgen runs (a one-line error for anything else)."""
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag in NOT_TAKEN:
            raise UsageError(f"loadgen bench serve: {flag} is a vllm bench serve flag that loadgen does not take")
    ns, extra = parser().parse_known_args(argv)
    if extra:
        raise UsageError(
            f"loadgen bench serve: {extra[0]} is not a flag it takes (vllm bench serve's flags; see --help)"
        )
    chat = ns.backend.endswith("chat") or (ns.endpoint or "").endswith("/chat/completions")
    endpoint = ns.endpoint or ("/v1/chat/completions" if chat else "/v1/completions")
    prefix = endpoint.removesuffix("/chat/completions").removesuffix("/completions")
    root = (ns.base_url or f"http://{ns.host}:{ns.port}").rstrip("/")
    base_url = root + prefix

    metrics = [m.strip() for m in ns.percentile_metrics.split(",") if m.strip()]
    names = ("ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue")
    unknown = [m for m in metrics if m not in names]
    if unknown:
        raise UsageError(f"--percentile-metrics: unknown metric {unknown[0]!r}; choose from {', '.join(names)}")
    try:
        percentiles = [float(p) for p in ns.metric_percentiles.split(",")]
    except ValueError:
        raise UsageError(f"--metric-percentiles {ns.metric_percentiles!r}: give numbers, e.g. 50,90,99") from None
    if not all(0 < p < 100 for p in percentiles):  # (nan fails it too)
        raise UsageError(f"--metric-percentiles {ns.metric_percentiles!r}: each between 0 and 100, e.g. 50,90,99")
    if ns.label is not None and ("/" in ns.label or "\0" in ns.label or ns.label in ("", ".", "..")):
        raise UsageError(f"--label {ns.label!r}: it begins the result's file name; give a name without '/', "
                         "and --result-dir for the folder")
    goodput: dict[str, float] = {}
    for key, value in _pairs("--goodput", ns.goodput, ":").items():
        if key not in ("ttft", "tpot", "e2el"):
            raise UsageError(f"--goodput {key}: choose ttft, tpot or e2el (milliseconds)")
        try:
            goodput[key] = float(value)
        except ValueError:
            raise UsageError(f"--goodput {key}:{value}: the value is milliseconds") from None

    # --input-len / --output-len stand for every dataset's own length flags, as in vLLM
    if ns.input_len is not None:
        ns.random_input_len = ns.input_len
    if ns.output_len is not None:
        for flag in ("random", "sharegpt", "custom", "hf", "prefix_repetition"):
            setattr(ns, f"{flag}_output_len", ns.output_len)
    workload: Unchecked = {"num_prompts": ns.num_prompts, "ignore_eos": ns.ignore_eos, "min_tokens": False}
    name = ns.dataset_name
    if name == "random":
        workload.update(input_tokens=ns.random_input_len, output_tokens=ns.random_output_len)
        if ns.random_range_ratio:
            dist = {"kind": "uniform", "range_ratio": ns.random_range_ratio}
            workload.update(input_dist=dist, output_dist=dist)
        if ns.random_prefix_len:
            workload["shared_prefix"] = {"prefixes": 1, "tokens": ns.random_prefix_len}
    elif name == "prefix_repetition":
        workload.update(input_tokens=ns.prefix_repetition_suffix_len, output_tokens=ns.prefix_repetition_output_len,
                        shared_prefix={"prefixes": ns.prefix_repetition_num_prefixes,
                                       "tokens": ns.prefix_repetition_prefix_len})
    else:
        if ns.dataset_path is None and not (name == "hf" and ns.hf_name):
            raise UsageError(f"--dataset-name {name} needs --dataset-path")
        dataset: Unchecked = {"kind": {"custom": "jsonl"}.get(name, name), "shuffle": not ns.disable_shuffle}
        if name == "hf":
            dataset["name"] = ns.hf_name or ns.dataset_path
            dataset["split"] = ns.hf_split or "train"
            if ns.hf_subset:
                dataset["subset"] = ns.hf_subset
            fixed = ns.hf_output_len
        else:
            dataset["path"] = ns.dataset_path
            fixed = ns.sharegpt_output_len if name == "sharegpt" else ns.custom_output_len
        if fixed is not None:
            dataset["output_tokens"] = fixed
        workload["dataset"] = dataset
    if ns.tokenizer or ns.model:
        workload["tokenizer"] = ns.tokenizer or ns.model
    sampling = {k: getattr(ns, k) for k in (
        "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
    ) if getattr(ns, k) is not None}
    if sampling:
        workload["sampling"] = sampling

    extra_body = _json("--extra-body", ns.extra_body)
    if ns.chat_template_kwargs:
        extra_body["chat_template_kwargs"] = _json("--chat-template-kwargs", ns.chat_template_kwargs)
    target: Unchecked = {"api": "chat" if chat else "completions", "base_url": base_url,
                              "model": ns.served_model_name or ns.model or "auto"}
    if extra_body:
        target["extra_body"] = extra_body
    if ns.header:
        target["headers"] = _pairs("--header", ns.header, "=")
    if ns.insecure:
        target["verify_tls"] = False
    if ns.request_id_prefix is not None:
        target["request_id_prefix"] = ns.request_id_prefix

    load: Unchecked = {
        "concurrency": ns.max_concurrency or "unlimited",
        "warmup_requests": ns.num_warmups,
        # vLLM's rules: infinite burstiness is a constant gap; its pacing (a gap before the
        # first request, the last sent at num_prompts / rate), so the same command offers the same load
        "burstiness": ns.burstiness if ns.burstiness != float("inf") else 1.0,
        "arrival": "constant" if ns.burstiness == float("inf") else "poisson" if ns.burstiness == 1 else "gamma",
        "pacing": "vllm-bench",
    }
    if ns.ramp_up_strategy is not None:
        if ns.ramp_up_start_rps is None or ns.ramp_up_end_rps is None:
            raise UsageError("--ramp-up-strategy needs --ramp-up-start-rps and --ramp-up-end-rps")
        load["ramp_up"] = {"strategy": ns.ramp_up_strategy, "start_rate": ns.ramp_up_start_rps,
                           "end_rate": ns.ramp_up_end_rps}
    elif ns.request_rate != float("inf"):
        load["rate"] = ns.request_rate
    if not 1 <= ns.repeats <= 100:
        raise UsageError(f"--repeats {ns.repeats}: between 1 and 100")
    if ns.repeats > 1:
        load["repeats"] = ns.repeats
    scenario: Unchecked = {"name": ns.label or "bench", "seed": ns.seed, "target": target,
                                "workload": workload, "load": load}
    if goodput:
        scenario["slo"] = {("e2e" if k == "e2el" else k) + "_ms": v for k, v in goodput.items()}
    return BenchArgs(ns, scenario, base_url, metrics, percentiles, goodput, _pairs("--metadata", ns.metadata, "="))
