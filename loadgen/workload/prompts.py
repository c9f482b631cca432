"""Prompts of an exact input token count, no two of a run alike.

- ``text`` (the default, on both APIs): words that are one token each in the common BPE
  vocabularies, as real clients send text; the template overhead and tokens per word are
  calibrated against the server (``TextCalibration``), and each request's
  ``usage.prompt_tokens`` reports any drift.
- ``token-ids`` (completions only; the procedure of the published speed tables): token-id
  prompts, exact by construction, which skip the server's tokenizer.
- ``{file: prompts.jsonl}``: prompts taken verbatim (no input length is enforced; the file's
  content is the user's, repeats included).

Every request of a run gets content no other request of the run carried: calibration probes,
warmups and measured requests, every cell, every worker, and every request of a duration run
(made on demand, never cycled). Request ``index`` of stream ``stream`` in cell ``cell`` opens
with a few words (or ids) that spell the triple in a fixed-width number, so its first
cache block differs from every other request's, and continues with content drawn from the
run's seed, so another run (another seed) differs too. The length is exact either way: the
opening is part of the prompt, not a salt added to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

import numpy as np
import orjson

from loadgen.errors import ScenarioError
from loadgen.scenario.matrix import Cell
from loadgen.scenario.schema import PromptFile, Sampling, Scenario, Target, Workload
from loadgen.workload.payload import PreparedRequest, Prompt, build_payload, encode_payload
from loadgen.workload.words import WORDS

# a request's key: cell (10 bits) | stream (2 bits) | index within the stream (30 bits)
KEY_BITS = 42


class Stream(IntEnum):
    """Which requests of a cell a prompt belongs to."""

    MEASURED = 0
    WARMUP = 1
    CALIBRATION = 2
    LOCUST = 3


def request_key(cell: int, stream: Stream, index: int) -> int:
    """The number that makes a prompt unique within its run (one per (cell, stream, index))."""
    if not (0 <= cell < 1 << 10 and 0 <= index < 1 << 30):
        raise ValueError(f"request key out of range: cell {cell}, index {index}")
    return (cell << 32) | (int(stream) << 30) | index


def key_digits(key: int, base: int) -> list[int]:
    """``key`` as a fixed-width number in ``base`` (most significant first)."""
    width = math.ceil(KEY_BITS / math.log2(base))
    digits = []
    for _ in range(width):
        key, d = divmod(key, base)
        digits.append(d)
    return digits[::-1]


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
            ids = obj.get("prompt_token_ids")
            if isinstance(ids, list):
                if not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
                    raise ScenarioError(f"{path}:{lineno}: prompt_token_ids must be a non-empty list of token ids")
                prompts.append(Prompt(None, token_ids=tuple(ids)))
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


def uses_token_ids(workload: Workload, api: str) -> bool:
    return workload.prompt == "token-ids" and api == "completions"


@dataclass(frozen=True, slots=True)
class PromptMaker:
    """Makes the run's prompts; picklable, so worker processes make the same ones."""

    workload: Workload
    api: str
    seed: int
    calibration: TextCalibration = TextCalibration()

    def prompt(self, input_tokens: int, cell: int, stream: Stream, index: int) -> Prompt:
        if uses_token_ids(self.workload, self.api):
            rng = np.random.default_rng((self.seed, cell, int(stream), index))
            lo, hi = self.workload.token_id_range
            head = [lo + d for d in key_digits(request_key(cell, stream, index), hi - lo)][:input_tokens]
            rest = rng.integers(lo, hi, size=input_tokens - len(head)).tolist()
            return Prompt(input_tokens, token_ids=tuple(head + rest))
        return Prompt(input_tokens, text=self.text(self.calibration.words_for(input_tokens), cell, stream, index))

    def text(self, words: int, cell: int, stream: Stream, index: int) -> str:
        """Exactly ``words`` words: the key's spelling, then words drawn from the seed."""
        rng = np.random.default_rng((self.seed, cell, int(stream), index))
        head = [WORDS[d] for d in key_digits(request_key(cell, stream, index), len(WORDS))][:words]
        rest = rng.integers(0, len(WORDS), size=words - len(head))
        return " ".join(head + [WORDS[i] for i in rest])


@dataclass(frozen=True, slots=True)
class RequestMaker:
    """Request ``i`` of one stream of one cell, as a serialised body (picklable)."""

    prompts: PromptMaker
    target: Target
    sampling: Sampling
    model: str
    cell: int
    stream: Stream
    input_tokens: int
    output_tokens: int
    ignore_eos: bool
    min_tokens: bool
    file_prompts: tuple[Prompt, ...] = ()  # prompts taken verbatim from a file, used in turn

    def request(self, i: int) -> PreparedRequest:
        if self.file_prompts:
            prompt = self.file_prompts[i % len(self.file_prompts)]
        else:
            prompt = self.prompts.prompt(self.input_tokens, self.cell, self.stream, i)
        body = build_payload(
            self.target.api, self.model, prompt, self.output_tokens, sampling=self.sampling,
            ignore_eos=self.ignore_eos, min_tokens=self.min_tokens,
            continuous_usage_stats=self.target.continuous_usage_stats,
        )
        return PreparedRequest(
            self.cell, encode_payload(body), prompt.input_tokens, self.output_tokens,
            warmup=self.stream == Stream.WARMUP,
        )


class RequestPool:
    """The requests of one stream of a cell: the first ``count`` serialised before the measured
    window; any later one (a duration run's) made when it is needed, never a repeat."""

    def __init__(self, maker: RequestMaker, count: int) -> None:
        self.maker = maker
        self.ready = [maker.request(i) for i in range(count)]

    def __getitem__(self, i: int) -> PreparedRequest:
        if i < len(self.ready):
            return self.ready[i]
        return self.maker.request(i)

    def __len__(self) -> int:
        return len(self.ready)


def needs_calibration(scenario: Scenario) -> bool:
    """Text prompts (the default, and every chat prompt) need the server's template overhead
    and tokens per word before they can hit an exact input length."""
    w = scenario.workload
    if isinstance(w.prompt, PromptFile):
        return False
    return not uses_token_ids(w, scenario.target.api)


def calibration_probes(scenario: Scenario, model: str, seed: int, cell: int) -> list[tuple[int, bytes]]:
    """The two probe requests (16 and 48 words, 1 output token) as (words, body); their text is
    unique like every prompt of the run (stream ``CALIBRATION`` of ``cell``)."""
    maker = PromptMaker(scenario.workload, scenario.target.api, seed)
    out = []
    for index, words in enumerate((16, 48)):
        body = build_payload(
            scenario.target.api, model, Prompt(None, text=maker.text(words, cell, Stream.CALIBRATION, index)), 1,
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


def request_maker(
    scenario: Scenario, cell: Cell, model: str, calibration: TextCalibration, seed: int, stream: Stream,
) -> RequestMaker:
    """How the requests of one stream of ``cell`` are made (the cell's point's workload)."""
    point = cell.point or scenario
    w = point.workload
    files: tuple[Prompt, ...] = ()
    if isinstance(w.prompt, PromptFile):
        files = tuple(read_prompt_file(w.prompt.file, w.num_prompts))
    return RequestMaker(
        PromptMaker(w, point.target.api, seed, calibration), point.target, w.sampling, model, cell.index, stream,
        cell.input_tokens, cell.output_tokens, w.ignore_eos, w.min_tokens, files,
    )


def prepare_requests(
    scenario: Scenario, cell: Cell, model: str, calibration: TextCalibration, seed: int,
    stream: Stream = Stream.MEASURED, count: int | None = None,
) -> RequestPool:
    """The cell's requests of ``stream``, serialised before the measured window (``count``
    defaults to the workload's num_prompts)."""
    maker = request_maker(scenario, cell, model, calibration, seed, stream)
    point = cell.point or scenario
    return RequestPool(maker, point.workload.num_prompts if count is None else count)
