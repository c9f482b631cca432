"""Prompts from datasets: ShareGPT, JSONL and Hugging Face datasets.

Each loader returns ``Sample``s (a prompt, and the output length the dataset asks for), in the
order requests take them. ShareGPT follows vLLM's benchmark rules, so one file and one seed give
the same requests in both tools: entries with fewer than two turns are dropped, the list is
shuffled with Python's ``random`` seeded with the seed (unless ``shuffle: false``), the first
turn is the prompt and the second turn's token count the output length, pairs with a prompt
under 4 tokens, a prompt over 1024, a sum over 2048 or (without a fixed output length) an
answer under 4 tokens are skipped, and a file with too few pairs is topped up by drawing
pairs again with the same seed.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from loadgen.errors import ScenarioError
from loadgen.scenario.shapes import Dataset
from loadgen.workload.payload import Prompt

# vLLM's length filters for ShareGPT and Hugging Face conversation datasets
MIN_LEN = 4
MAX_PROMPT_LEN = 1024
MAX_TOTAL_LEN = 2048
HF_COLUMNS = ("prompt", "question", "instruction", "text", "input", "conversations", "messages")

Count = Callable[[str], int]


@dataclass(frozen=True, slots=True)
class Sample:
    prompt: Prompt
    output_tokens: int | None  # None: the cell's output_tokens


@dataclass(frozen=True, slots=True)
class Loaded:
    samples: tuple[Sample, ...]
    notes: tuple[str, ...] = ()  # what was skipped or filled in, in words


def word_count(text: str) -> int:
    return len(text.split())


def load_tokenizer(spec: str) -> Count:
    """A token counter from a tokenizer.json, a model directory holding one, or a hub id."""
    from tokenizers import Tokenizer

    path = Path(spec).expanduser()
    try:
        if path.is_dir():
            path = path / "tokenizer.json"
        if path.is_file():
            tok = Tokenizer.from_file(str(path))
        elif spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
            tok = Tokenizer.from_pretrained(spec)
        else:
            raise ScenarioError(
                f"workload.tokenizer: {spec} has no tokenizer.json; give a file, a model directory or a hub id"
            )
    except ScenarioError:
        raise
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises plain Exception
        first = (str(exc) or type(exc).__name__).splitlines()[0][:200]
        raise ScenarioError(f"workload.tokenizer: cannot load {spec} ({first})") from exc

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=True).ids)

    return count


def _bad(path: Path, where: str, what: str, dataset: Dataset) -> ScenarioError:
    hint = "" if dataset.skip_invalid else "; fix it, or set workload.dataset.skip_invalid: true to skip such records"
    return ScenarioError(f"{path}: {where}: {what}{hint}")


def _read_json(path: Path) -> Any:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the dataset ({exc.strerror or exc})") from exc
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        why = str(exc).splitlines()[0][:160]
        raise ScenarioError(f"{path}: not valid JSON ({why}); is the file complete?") from exc


def _pairs(
    entries: list[Any], path: Path, dataset: Dataset, label: Callable[[int, Any], str]
) -> tuple[list[tuple[str, str]], int, int]:
    """Conversations -> (first turn, second turn); entries under two turns are dropped (as vLLM
    does) and counted; a malformed entry is an error, or skipped and counted with skip_invalid."""
    pairs: list[tuple[str, str]] = []
    short = invalid = 0
    for i, entry in enumerate(entries):
        turns = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(entry, dict):
            problem = "is not an object"
        elif "conversations" not in entry:
            problem = "has no 'conversations'"
        elif not isinstance(turns, list):
            problem = "'conversations' is not a list"
        else:
            if len(turns) < 2:
                short += 1
                continue
            first, second = turns[0], turns[1]
            if isinstance(first, dict) and isinstance(second, dict) and isinstance(first.get("value"), str) \
                    and isinstance(second.get("value"), str):
                pairs.append((first["value"], second["value"]))
                continue
            problem = "its first two turns need a string 'value'"
        if not dataset.skip_invalid:
            raise _bad(path, label(i, entry), problem, dataset)
        invalid += 1
    return pairs, short, invalid


def _sample_pairs(
    pairs: list[tuple[str, str]], count: int, seed: int, dataset: Dataset, counter: Count,
) -> tuple[list[Sample], int]:
    """vLLM's sampling of (prompt, answer) pairs, in order, with its length filters."""
    fixed = dataset.output_tokens
    samples: list[Sample] = []
    filtered = 0
    for prompt, answer in pairs:
        if len(samples) >= count:
            break
        prompt_len = counter(prompt)
        output_len = fixed if fixed is not None else counter(answer)
        if (
            prompt_len < MIN_LEN or (fixed is None and output_len < MIN_LEN)
            or prompt_len > MAX_PROMPT_LEN or prompt_len + output_len > MAX_TOTAL_LEN
        ):
            filtered += 1
            continue
        samples.append(Sample(Prompt(prompt_len, text=prompt), output_len))
    return samples, filtered


def _top_up(samples: list[Sample], count: int, seed: int) -> list[Sample]:
    """Too few samples: draw more from them with the seed, as vLLM oversamples."""
    if not samples or len(samples) >= count:
        return samples
    rng = random.Random(seed)
    return samples + [rng.choice(samples) for _ in range(count - len(samples))]


def sharegpt(dataset: Dataset, count: int, seed: int, counter: Count) -> Loaded:
    assert dataset.path is not None
    path = dataset.path
    data = _read_json(path)
    if not isinstance(data, list):
        raise ScenarioError(f"{path}: a ShareGPT file is a JSON list of {{id, conversations}} objects")

    def label(i: int, entry: Any) -> str:
        ident = entry.get("id") if isinstance(entry, dict) else None
        return f"record {i}" + (f" (id {ident})" if ident is not None else "")

    pairs, short, invalid = _pairs(data, path, dataset, label)
    if dataset.shuffle:
        random.Random(seed).shuffle(pairs)
    samples, filtered = _sample_pairs(pairs, count, seed, dataset, counter)
    return _finish(path, samples, count, seed, short, invalid, filtered)


def _finish(
    where: Path | str, samples: list[Sample], count: int, seed: int, short: int, invalid: int, filtered: int,
) -> Loaded:
    notes = []
    if short:
        notes.append(f"{short} conversations with fewer than two turns left out (as vLLM does)")
    if invalid:
        notes.append(f"{invalid} malformed records skipped")
    if filtered:
        notes.append(f"{filtered} pairs outside vLLM's length limits skipped")
    if not samples:
        raise ScenarioError(f"{where}: no usable prompt in the dataset ({'; '.join(notes) or 'it is empty'})")
    if len(samples) < count:
        notes.append(f"{len(samples)} usable prompts for {count} requests: the rest drawn again from them")
    return Loaded(tuple(_top_up(samples, count, seed)), tuple(notes))


def _jsonl_rows(path: Path) -> Iterator[tuple[int, bytes]]:
    try:
        f = path.open("rb")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the prompt file ({exc.strerror or exc})") from exc
    with f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                yield lineno, line


def _row_prompt(obj: Any) -> tuple[Prompt | None, str | None]:
    if not isinstance(obj, dict):
        return None, "expected a JSON object"
    ids = obj.get("prompt_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not ids or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids
        ):
            return None, "prompt_token_ids must be a non-empty list of token ids"
        return Prompt(len(ids), token_ids=tuple(ids)), None
    if isinstance(obj.get("prompt"), str):
        return Prompt(None, text=obj["prompt"]), None
    messages = obj.get("messages")
    if isinstance(messages, list) and messages and all(
        isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages
    ):
        return Prompt(None, messages=tuple(messages)), None
    if messages is not None:
        return None, "messages must be a non-empty list of {role, content} objects"
    return None, "each line needs 'prompt', 'prompt_token_ids' or 'messages'"


def jsonl(dataset: Dataset, count: int, seed: int) -> Loaded:
    """Rows taken in file order (``shuffle`` is not applied: the file's order is the user's)."""
    assert dataset.path is not None
    path = dataset.path
    samples: list[Sample] = []
    invalid = 0
    for lineno, line in _jsonl_rows(path):
        problem: str | None
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            obj = None
        prompt, problem = _row_prompt(obj) if obj is not None else (None, "not valid JSON")
        out = obj.get("output_tokens") if isinstance(obj, dict) else None
        if prompt is not None and out is not None and (isinstance(out, bool) or not isinstance(out, int) or out < 1):
            prompt, problem = None, "output_tokens must be a positive integer"
        if prompt is None:
            if not dataset.skip_invalid:
                raise _bad(path, f"line {lineno}", problem or "unreadable", dataset)
            invalid += 1
            continue
        samples.append(Sample(prompt, dataset.output_tokens or out))
        if len(samples) >= count:
            break
    if not samples:
        skipped = f" ({invalid} malformed lines skipped)" if invalid else ""
        raise ScenarioError(f"{path}: no prompts in file{skipped}")
    notes = (f"{invalid} malformed lines skipped",) if invalid else ()
    return Loaded(tuple(samples), notes)


def _row_label(row: int) -> Callable[[int, Any], str]:
    return lambda _i, _e: f"row {row}"


def huggingface(dataset: Dataset, count: int, seed: int, counter: Count) -> Loaded:
    """A Hugging Face dataset: a ``save_to_disk`` directory, or a hub id (needs the hub)."""
    try:
        import datasets as hf
    except ImportError as exc:
        raise ScenarioError(
            "workload.dataset kind hf needs the datasets library: pip install 'loadgen[datasets]'"
        ) from exc
    where = str(dataset.path or dataset.name)
    local = Path(where).expanduser()
    try:
        if local.is_dir():
            data = hf.load_from_disk(str(local))
            if isinstance(data, hf.DatasetDict):
                if dataset.split not in data:
                    raise ScenarioError(
                        f"{where}: no split {dataset.split!r} (has {', '.join(data)}); set workload.dataset.split"
                    )
                data = data[dataset.split]
        else:
            data = hf.load_dataset(where, dataset.subset, split=dataset.split)
    except ScenarioError:
        raise
    except Exception as exc:  # noqa: BLE001 - datasets raises many kinds; the user needs one line
        first = (str(exc) or type(exc).__name__).splitlines()[0][:200]
        raise ScenarioError(f"workload.dataset: cannot load {where} ({first})") from exc
    column = dataset.column or next((c for c in HF_COLUMNS if c in data.column_names), None)
    if column is None or column not in data.column_names:
        raise ScenarioError(
            f"{where}: no prompt column {dataset.column or ''}; it has {', '.join(data.column_names)}: "
            "set workload.dataset.column"
        )
    if dataset.shuffle:
        data = data.shuffle(seed=seed % 2**32)
    pairs: list[tuple[str, str]] = []
    texts: list[str] = []
    invalid = short = 0
    for i, value in enumerate(data[column]):
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, list):
            got, n_short, bad = _pairs([{"conversations": value}], local, dataset, _row_label(i))
            pairs += got
            short += n_short
            invalid += bad
        elif not dataset.skip_invalid:
            raise _bad(local, f"row {i}", f"column {column} is neither text nor a conversation", dataset)
        else:
            invalid += 1
        if len(texts) + len(pairs) >= count * 4:
            break
    if pairs:
        samples, filtered = _sample_pairs(pairs, count, seed, dataset, counter)
    else:
        samples = [Sample(Prompt(counter(t), text=t), dataset.output_tokens) for t in texts[:count]]
        filtered = 0
    return _finish(where, samples, count, seed, short, invalid, filtered)


def load(dataset: Dataset, count: int, seed: int, counter: Count | None) -> Loaded:
    """The dataset's first ``count`` samples (topped up when it has fewer)."""
    count_tokens = counter or word_count
    if dataset.kind == "sharegpt":
        return sharegpt(dataset, count, seed, count_tokens)
    if dataset.kind == "jsonl":
        return jsonl(dataset, count, seed)
    return huggingface(dataset, count, seed, count_tokens)
