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

import functools
import math
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Any

import numpy as np

from loadgen.data import RequestBody
from loadgen.scenario.matrix import Cell
from loadgen.scenario.schema import PromptFile, Scenario, Workload
from loadgen.scenario.sessionfile import FileSession, read_sessions
from loadgen.scenario.shapes import Dataset
from loadgen.scenario.target import Sampling, Target
from loadgen.workload import datasets
from loadgen.workload.datasets import Sample
from loadgen.workload.images import directory_files, request_images
from loadgen.workload.lengths import draw
from loadgen.workload.payload import Api, PreparedRequest, Prompt, build_payload, encode_payload, structured_of
from loadgen.workload.share import Share
from loadgen.workload.tools import tool_choice, tool_definitions
from loadgen.workload.trace import TraceRow, read_trace
from loadgen.workload.words import WORDS

# a request's key: cell (10 bits) | stream (2 bits) | index within the stream (30 bits)
KEY_BITS = 42
# seed namespaces of shared content, apart from every cell's (cells are numbered below 2**10)
PREFIX_SPACE = 1 << 11
BLOCK_SPACE = 1 << 12
LENGTH_DRAW = 7


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
    digits = []
    for _ in range(_key_width(base)):
        key, d = divmod(key, base)
        digits.append(d)
    return digits[::-1]


@functools.cache
def _key_width(base: int) -> int:
    return math.ceil(KEY_BITS / math.log2(base))


def _rng(entropy: tuple[int, ...]) -> np.random.Generator:
    """A generator seeded by ``entropy``: ``np.random.default_rng(entropy)``'s stream, made in
    two thirds of its time (it is made once per request: 200,000 for a large run)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


# the words as an array: a draw of indices picks its words in one step
_WORD_ARRAY = np.array(WORDS, dtype=object)


@dataclass(frozen=True, slots=True)
class TextCalibration:
    """Server-side length of a text prompt: ``overhead + per_word * words`` tokens."""

    overhead: float = 0.0
    per_word: float = 1.0

    def words_for(self, tokens: int) -> int:
        return max(1, round((tokens - self.overhead) / self.per_word))


def uses_token_ids(workload: Workload, api: str) -> bool:
    return workload.prompt == "token-ids" and api == "completions"


@dataclass(frozen=True, slots=True)
class PromptMaker:
    """Makes the run's prompts; picklable, so worker processes make the same ones."""

    workload: Workload
    api: str
    seed: int
    calibration: TextCalibration = TextCalibration()

    def prompt(self, input_tokens: int, cell: int, stream: Stream, index: int, prefix: int | None = None) -> Prompt:
        """``input_tokens`` of content unique to (cell, stream, index), after shared prefix
        ``prefix`` (of ``workload.shared_prefix.tokens``) when one is given."""
        shared = self.workload.shared_prefix
        head_ids: list[int] = []
        head_words: list[str] = []
        total = input_tokens
        if prefix is not None and shared is not None:
            total += shared.tokens
            if uses_token_ids(self.workload, self.api):
                head_ids = self._ids(shared.tokens, _rng((self.seed, PREFIX_SPACE, prefix)))
            else:
                n = max(1, round(shared.tokens / self.calibration.per_word))
                # it opens with the word this request's own text would open with (its key's
                # leading digit): a tokenizer splits a prompt's first word, which has no space
                # before it, as it pleases, and the calibration measured that split on this word
                opening = WORDS[key_digits(request_key(cell, stream, index), len(WORDS))[0]]
                rest = self._words(n - 1, _rng((self.seed, PREFIX_SPACE, prefix)))
                head_words = [opening, *rest]
        if uses_token_ids(self.workload, self.api):
            return Prompt(total, token_ids=tuple(head_ids + self.unique_ids(input_tokens, cell, stream, index)))
        words = self.calibration.words_for(total) - len(head_words)
        return Prompt(total, text=" ".join(head_words + [self.text(max(words, 1), cell, stream, index)]))

    def _ids(self, n: int, rng: np.random.Generator) -> list[int]:
        lo, hi = self.workload.token_id_range
        ids: list[int] = rng.integers(lo, hi, size=n).tolist()
        return ids

    @staticmethod
    def _words(n: int, rng: np.random.Generator) -> list[str]:
        words: list[str] = _WORD_ARRAY[rng.integers(0, len(WORDS), size=n)].tolist()
        return words

    def unique_ids(self, n: int, cell: int, stream: Stream, index: int) -> list[int]:
        rng = _rng((self.seed, cell, int(stream), index))
        lo, hi = self.workload.token_id_range
        head = [lo + d for d in key_digits(request_key(cell, stream, index), hi - lo)][:n]
        return head + self._ids(n - len(head), rng)

    def text(self, words: int, cell: int, stream: Stream, index: int) -> str:
        """Exactly ``words`` words: the key's spelling, then words drawn from the seed."""
        rng = _rng((self.seed, cell, int(stream), index))
        head = [WORDS[d] for d in key_digits(request_key(cell, stream, index), len(WORDS))][:words]
        return " ".join(head + self._words(words - len(head), rng))

    def trace_prompt(self, row: TraceRow, block_tokens: int, cell: int, stream: Stream, index: int) -> Prompt:
        """A trace row's prompt: block ``h`` of its ``hash_ids`` is the same content wherever h
        appears; what the blocks do not cover is content of this request's own."""
        n = row.input_length
        if uses_token_ids(self.workload, self.api):
            ids: list[int] = []
            for h in row.hash_ids:
                ids += self._ids(block_tokens, _rng((self.seed, BLOCK_SPACE, h)))
            ids = ids[:n]
            if len(ids) < n:
                ids += self.unique_ids(n - len(ids), cell, stream, index)
            return Prompt(n, token_ids=tuple(ids))
        want = self.calibration.words_for(n)
        per_block = max(1, round(block_tokens / self.calibration.per_word))
        words: list[str] = []
        for h in row.hash_ids:
            if len(words) >= want:
                break
            words += self._words(per_block, _rng((self.seed, BLOCK_SPACE, h)))
        words = words[:want]
        text = " ".join(words)
        if len(words) < want:
            text = " ".join(filter(None, (text, self.text(want - len(words), cell, stream, index))))
        return Prompt(n, text=text)


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
    samples: tuple[Sample, ...] = ()  # dataset prompts, used in turn
    trace: tuple[TraceRow, ...] = ()  # trace rows, one per request
    tools: tuple[dict[str, Any], ...] = ()  # tool definitions sent with each chat request
    sessions: tuple[FileSession, ...] = ()  # agent sessions from a file, used in turn

    @property
    def forced(self) -> bool:
        """Whether the output length is forced: not where the model ends its answer itself (a
        structured answer, a tool call)."""
        return self.prompts.workload.response_format is None and not self.tools

    def body(self, prompt: Prompt, out: int, api: Api | None = None) -> RequestBody:
        """The request's JSON body (``api``: another than the target's, for a session's turn)."""
        w = self.prompts.workload
        return build_payload(
            api or self.target.api, self.model, prompt, out, sampling=self.sampling,
            ignore_eos=self.ignore_eos and self.forced, min_tokens=self.min_tokens and self.forced,
            continuous_usage_stats=self.target.continuous_usage_stats, target=self.target,
            response_format=w.response_format, tools=self.tools,
            tool_choice=tool_choice(w.tools.choice) if w.tools is not None else None,
        )

    def lengths(self, i: int) -> tuple[int, int]:
        """Request i's input and output lengths (drawn from the workload's distributions)."""
        w = self.prompts.workload
        if w.input_dist.kind == "fixed" and w.output_dist.kind == "fixed":
            return self.input_tokens, self.output_tokens
        rng = _rng((self.prompts.seed, self.cell, int(self.stream), i, LENGTH_DRAW))
        return draw(w.input_dist, self.input_tokens, rng), draw(w.output_dist, self.output_tokens, rng)

    def prompt(self, i: int) -> tuple[Prompt, int]:
        """Request i's prompt and output length."""
        if self.trace:
            row = self.trace[i % len(self.trace)]
            trace = self.prompts.workload.trace
            assert trace is not None  # rows come from it
            return self.prompts.trace_prompt(row, trace.block_tokens, self.cell, self.stream, i), row.output_length
        if self.samples:
            sample = self.samples[i % len(self.samples)]
            return sample.prompt, sample.output_tokens or self.output_tokens
        inp, out = self.lengths(i)
        shared = self.prompts.workload.shared_prefix
        prefix = i % shared.prefixes if shared is not None and self.stream == Stream.MEASURED else None
        return self.prompts.prompt(inp, self.cell, self.stream, i, prefix), out

    def request(self, i: int) -> PreparedRequest:
        prompt, out = self.prompt(i)
        batch = self.prompts.workload.batch_size if self.target.api == "embeddings" else 0
        if batch:  # an embeddings request: batch_size texts of the input length, each its own
            texts = [self.prompt(i * batch + j)[0] for j in range(batch)]
            prompt = Prompt(sum(p.input_tokens or 0 for p in texts), inputs=tuple(p.text or "" for p in texts))
        images, image_bytes = self.images(i)
        if images:
            prompt = replace(prompt, images=images)
        return PreparedRequest(
            self.cell, encode_payload(self.body(prompt, out)), prompt.input_tokens, out,
            warmup=self.stream == Stream.WARMUP, structured=structured_of(self.prompts.workload.response_format),
            image_bytes=image_bytes, embeddings=batch,
        )

    def images(self, i: int) -> tuple[tuple[str, ...], int]:
        """Request i's images (data URLs) and their bytes; none without workload.images."""
        spec = self.prompts.workload.images
        if spec is None:
            return (), 0
        files = directory_files(spec) if spec.directory is not None else None
        return request_images(spec, (self.prompts.seed, self.cell, int(self.stream), i), files)


# requests serialised between two turns of the event loop while a cell's pool is made (about
# 0.1 s of work); a pool larger than one slice is shown on the console as it is made
MAKE_SLICE = 2000


class RequestPool:
    """The requests of one stream of a cell: the first ``count`` serialised before the measured
    window; any later one (a duration run's) made when it is needed, never a repeat."""

    def __init__(self, maker: RequestMaker, count: int, *, serialise: bool = True, eager: bool = True) -> None:
        self.maker = maker
        self.size = count
        # multi-turn sessions build each turn's body from the answers so far: nothing to make ahead
        self.ahead = count if serialise else 0
        self.ready: list[PreparedRequest] = []
        if eager:
            self.make(self.ahead)

    def make(self, n: int) -> int:
        """Serialise up to ``n`` more of the requests made ahead of the window (a large pool is
        made a slice at a time by a caller that keeps its event loop free); how many are left."""
        start = len(self.ready)
        self.ready += [self.maker.request(i) for i in range(start, min(self.ahead, start + n))]
        return self.ahead - len(self.ready)

    def __getitem__(self, i: int) -> PreparedRequest:
        if i < len(self.ready):
            return self.ready[i]
        return self.maker.request(i)

    def __len__(self) -> int:
        return self.size


class PoolShare:
    """The requests of a pool that one client worker sends (``share``). Sent to its
    process before they are made (the requests the pool has made already come with it), the
    worker makes the rest of its share itself (``make``), in parallel with the others: for
    200,000 prompts the parent made every body (9 s on one core) and pickled each worker's share
    (80 MB for each of two). Past the requests made ahead, made on demand."""

    def __init__(self, pool: RequestPool, share: Share) -> None:
        self.maker, self.size, self.ahead, self.share = pool.maker, pool.size, pool.ahead, share
        self.ready = [pool.ready[share.index(j)] for j in range(share.below(len(pool.ready)))]
        self.total = share.below(self.ahead)  # this share's requests to make ahead

    def make(self, n: int) -> int:
        """Serialise up to ``n`` more of this share's requests made ahead; how many are left."""
        start = len(self.ready)
        index = self.share.index
        self.ready += [self.maker.request(index(j)) for j in range(start, min(self.total, start + n))]
        return self.total - len(self.ready)

    def __getitem__(self, i: int) -> PreparedRequest:
        j = self.share.position(i)
        if j is None:
            raise IndexError(f"request {i} is another worker's")
        return self.ready[j] if j < len(self.ready) else self.maker.request(i)

    def __len__(self) -> int:
        return self.size


def needs_calibration(scenario: Scenario) -> bool:
    """Text prompts (the default, and every chat prompt) need the server's template overhead
    and tokens per word before they can hit an exact input length."""
    w = scenario.workload
    if w.source in ("sharegpt", "jsonl", "hf", "sessions"):
        return False
    return not uses_token_ids(w, scenario.target.api)


def calibration_requests(scenario: Scenario, model: str, seed: int, cell: int) -> list[tuple[int, bytes]]:
    """The two probe requests (16 and 48 words, 1 output token) as (words, body); their text is
    unique like every prompt of the run (stream ``CALIBRATION`` of ``cell``)."""
    maker = PromptMaker(scenario.workload, scenario.target.api, seed)
    # opening with the word the cell's measured prompts open with (in a few high cells the
    # stream's bits reach the key's leading digit): how a tokenizer splits a prompt's first
    # word is part of what is measured
    opening = WORDS[key_digits(request_key(cell, Stream.MEASURED, 0), len(WORDS))[0]]
    out = []
    for index, words in enumerate((16, 48)):
        text = " ".join([opening, *maker.text(words, cell, Stream.CALIBRATION, index).split()[1:]])
        body = build_payload(
            scenario.target.api, model, Prompt(None, text=text), 1,
            sampling=scenario.workload.sampling, ignore_eos=scenario.workload.ignore_eos,
            min_tokens=scenario.workload.min_tokens,
            continuous_usage_stats=scenario.target.continuous_usage_stats, target=scenario.target,
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


def dataset_of(workload: Workload) -> Dataset | None:
    """The workload's dataset; a ``prompt: {file: ...}`` is a JSONL dataset."""
    if isinstance(workload.prompt, PromptFile):
        return Dataset(kind="jsonl", path=workload.prompt.file)
    return workload.dataset


def request_maker(
    cell: Cell, model: str, calibration: TextCalibration, seed: int, stream: Stream,
    sources: Sources | None = None, *, ignore_eos: bool | None = None, min_tokens: bool | None = None,
) -> RequestMaker:
    """How the requests of one stream of ``cell`` are made (the cell's point's workload).
    Warmups get generated prompts of the cell's lengths, so no dataset or trace prompt is
    sent (and cached) before it is measured; measured requests and Locust's users get the
    ``sources``."""
    point = cell.point
    w = point.workload
    samples: tuple[Sample, ...] = ()
    trace: tuple[TraceRow, ...] = ()
    sessions: tuple[FileSession, ...] = ()
    if stream in (Stream.MEASURED, Stream.LOCUST) and sources is not None:
        samples, trace, sessions = sources.samples, sources.trace, sources.sessions
    return RequestMaker(
        PromptMaker(w, point.target.api, seed, calibration), point.target, w.sampling, model, cell.index, stream,
        cell.input_tokens, cell.output_tokens,
        w.ignore_eos if ignore_eos is None else ignore_eos, w.min_tokens if min_tokens is None else min_tokens,
        samples, trace, tool_definitions(w.tools) if w.tools is not None else (), sessions,
    )


@dataclass(frozen=True, slots=True)
class Sources:
    """A cell's dataset samples or trace rows, read once before it starts."""

    samples: tuple[Sample, ...] = ()
    trace: tuple[TraceRow, ...] = ()
    notes: tuple[str, ...] = ()
    sessions: tuple[FileSession, ...] = ()  # agent sessions from a file
    session_count: int = 0  # the sessions a cell runs: num_prompts, or the file's

    @property
    def count(self) -> int | None:
        return len(self.trace) if self.trace else self.session_count or None


def read_sources(point: Scenario, seed: int, counter: datasets.Count | None) -> Sources:
    """Read the dataset or trace a cell's workload names (``counter`` counts tokens)."""
    w = point.workload
    if w.multi_turn is not None and w.multi_turn.file is not None:
        sessions = read_sessions(w.multi_turn.file)
        count = w.num_prompts if "num_prompts" in w.model_fields_set else len(sessions)  # else the whole file
        notes = (f"{count} sessions from a file of {len(sessions)}: each sent more than once, the same "
                 "content each time",) if count > len(sessions) else ()
        return Sources(sessions=sessions, session_count=count, notes=notes)
    if w.trace is not None:
        limit = w.num_prompts if "num_prompts" in w.model_fields_set else None  # else the whole trace
        rows = read_trace(w.trace.file, w.trace.speedup, limit)
        return Sources(trace=tuple(rows))
    dataset = dataset_of(w)
    if dataset is None:
        return Sources()
    loaded = datasets.load(dataset, w.num_prompts, seed, counter)
    return Sources(samples=loaded.samples, notes=loaded.notes)


def prepare_requests(
    cell: Cell, model: str, calibration: TextCalibration, seed: int,
    stream: Stream = Stream.MEASURED, count: int | None = None, sources: Sources | None = None,
    eager: bool = True, **flags: bool | None,
) -> RequestPool:
    """The cell's requests of ``stream``, serialised before the measured window (``count``
    defaults to the workload's num_prompts; a trace's rows, when there is one); not ``eager``:
    the caller serialises them (``RequestPool.make``)."""
    point = cell.point
    if sources is None and stream == Stream.MEASURED and point.workload.source != "generated":
        sources = read_sources(point, seed, None)
    maker = request_maker(cell, model, calibration, seed, stream, sources, **flags)
    if count is None:
        count = (sources.count if sources is not None else None) or point.workload.num_prompts
    return RequestPool(maker, count, serialise=stream != Stream.MEASURED or point.workload.multi_turn is None,
                       eager=eager)
