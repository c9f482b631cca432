"""Prompts of an exact input token count, built up front from the seed.

- completions + ``random-tokens``: token-id prompts, exact by construction (the server's
  ``usage.prompt_tokens`` is still checked per request).
- chat, or ``text``: words that are one token each in the common BPE vocabularies; the
  template overhead and tokens per word are calibrated against the server
  (``TextCalibration``), and each request's ``usage.prompt_tokens`` reports the drift.
- ``{file: prompts.jsonl}``: prompts taken verbatim (no input length is enforced).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from loadgen.errors import ScenarioError
from loadgen.scenario.matrix import Cell
from loadgen.scenario.schema import PromptFile, Scenario, Workload
from loadgen.workload.payload import PreparedRequest, Prompt, build_payload, encode_payload
from loadgen.workload.words import random_words


@dataclass(frozen=True, slots=True)
class TextCalibration:
    """Server-side length of a text prompt: ``overhead + per_word * words`` tokens."""

    overhead: float = 0.0
    per_word: float = 1.0

    def words_for(self, tokens: int) -> int:
        return max(1, round((tokens - self.overhead) / self.per_word))


def read_prompt_file(path: Path, limit: int) -> list[Prompt]:
    prompts: list[Prompt] = []
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise ScenarioError(f"{path}:{lineno}: not valid JSON") from exc
            if not isinstance(obj, dict):
                raise ScenarioError(f"{path}:{lineno}: expected a JSON object")
            if isinstance(obj.get("prompt_token_ids"), list):
                prompts.append(Prompt(None, token_ids=tuple(int(t) for t in obj["prompt_token_ids"])))
            elif isinstance(obj.get("prompt"), str):
                prompts.append(Prompt(None, text=obj["prompt"]))
            elif isinstance(obj.get("messages"), list):
                prompts.append(Prompt(None, messages=tuple(obj["messages"])))
            else:
                raise ScenarioError(
                    f"{path}:{lineno}: each line needs 'prompt', 'prompt_token_ids' or 'messages'"
                )
            if len(prompts) >= limit:
                break
    if not prompts:
        raise ScenarioError(f"{path}: no prompts in file")
    return prompts


def build_prompts(
    workload: Workload,
    input_tokens: int,
    *,
    api: str,
    seed: int,
    calibration: TextCalibration = TextCalibration(),
) -> list[Prompt]:
    """``workload.num_prompts`` prompts of ``input_tokens`` tokens each, reproducible from seed.

    The generator is seeded with (seed, input_tokens), so cells that differ only in load
    send the very same prompts.
    """
    n = workload.num_prompts
    if isinstance(workload.prompt, PromptFile):
        pool = read_prompt_file(workload.prompt.file, n)
        return [pool[i % len(pool)] for i in range(n)]
    rng = np.random.default_rng((seed, input_tokens))
    if workload.prompt == "random-tokens" and api == "completions":
        lo, hi = workload.token_id_range
        ids = rng.integers(lo, hi, size=(n, input_tokens))
        return [Prompt(input_tokens, token_ids=tuple(row.tolist())) for row in ids]
    words = calibration.words_for(input_tokens)
    return [Prompt(input_tokens, text=random_words(rng, words)) for _ in range(n)]


def needs_calibration(scenario: Scenario) -> bool:
    """Text prompts (chat, or ``prompt: text``) need the server's template overhead and
    tokens per word before they can hit an exact input length."""
    w = scenario.workload
    if isinstance(w.prompt, PromptFile):
        return False
    return scenario.target.api == "chat" or w.prompt == "text"


def calibration_probes(scenario: Scenario, model: str) -> list[tuple[int, bytes]]:
    """The two probe requests (16 and 48 words, 1 output token) as (words, body)."""
    rng = np.random.default_rng(scenario.seed)
    out = []
    for words in (16, 48):
        body = build_payload(
            scenario.target.api, model, Prompt(None, text=random_words(rng, words)), 1,
            sampling=scenario.workload.sampling, ignore_eos=scenario.workload.ignore_eos,
            min_tokens=scenario.workload.min_tokens,
            continuous_usage_stats=scenario.target.continuous_usage_stats,
        )
        out.append((words, encode_payload(body)))
    return out


def calibration_from(points: list[tuple[int, int | None]]) -> TextCalibration:
    """The probes' (words, server's prompt_tokens) -> overhead and tokens per word; the
    identity when the server reported no usage or the counts make no sense."""
    if len(points) != 2:
        return TextCalibration()
    (w1, t1), (w2, t2) = points
    if t1 is None or t2 is None:
        return TextCalibration()
    per_word = (t2 - t1) / (w2 - w1)
    if per_word <= 0:
        return TextCalibration()
    return TextCalibration(overhead=t1 - per_word * w1, per_word=per_word)


def prepare_requests(
    scenario: Scenario, cell: Cell, model: str, calibration: TextCalibration
) -> list[PreparedRequest]:
    """The cell's prompts as serialised request bodies, built before the measured window."""
    point = cell.point or scenario
    w = point.workload
    prompts = build_prompts(w, cell.input_tokens, api=point.target.api, seed=scenario.seed, calibration=calibration)
    return [
        PreparedRequest(
            cell.index,
            encode_payload(build_payload(
                point.target.api, model, p, cell.output_tokens, sampling=w.sampling,
                ignore_eos=w.ignore_eos, min_tokens=w.min_tokens,
                continuous_usage_stats=point.target.continuous_usage_stats,
            )),
            p.input_tokens,
            cell.output_tokens,
        )
        for p in prompts
    ]
