"""Request traces: JSONL rows with a timestamp and lengths, replayed on their schedule.

The layout is Mooncake's: ``timestamp`` (milliseconds), ``input_length``, ``output_length`` and
optional ``hash_ids``, where equal ids stand for the same block of prompt tokens. Offsets are
measured from the first row's timestamp and divided by the speedup factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import orjson

from loadgen.errors import ScenarioError
from loadgen.scenario.shapes import MAX_TOKENS
from loadgen.scenario.target import MAX_SECONDS


@dataclass(frozen=True, slots=True)
class TraceRow:
    offset_s: float  # when to send, after the first row
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()


def _int(obj: dict[str, object], key: str, path: Path, lineno: int, minimum: int) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_TOKENS:
        raise ScenarioError(f"{path}:{lineno}: {key} must be an integer from {minimum} to {MAX_TOKENS:,} "
                            f"(got {value!r})")
    return value


def read_trace(path: Path, speedup: float = 1.0, limit: int | None = None) -> list[TraceRow]:
    """The first ``limit`` rows of a trace (every row when None), in timestamp order."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the trace ({exc.strerror or exc})") from exc
    raw: list[tuple[float, int, int, tuple[int, ...]]] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise ScenarioError(f"{path}:{lineno}: not valid JSON") from None
        if not isinstance(obj, dict):
            raise ScenarioError(f"{path}:{lineno}: expected an object with timestamp, input_length, output_length")
        ts = obj.get("timestamp")
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
            raise ScenarioError(f"{path}:{lineno}: timestamp must be a number of milliseconds >= 0 (got {ts!r})")
        ids = obj.get("hash_ids", [])
        if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
            raise ScenarioError(f"{path}:{lineno}: hash_ids must be a list of integers")
        raw.append((float(ts), _int(obj, "input_length", path, lineno, 1), _int(obj, "output_length", path, lineno, 1),
                    tuple(ids)))
        if limit is not None and len(raw) >= limit:
            break
    if not raw:
        raise ScenarioError(f"{path}: the trace has no rows")
    raw.sort(key=lambda r: r[0])
    t0 = raw[0][0]
    if (span := (raw[-1][0] - t0) / 1000.0 / speedup) > MAX_SECONDS:
        raise ScenarioError(f"{path}: the trace spans {span / 86400:,.0f} days at speedup {speedup:g}, past a run's "
                            f"{MAX_SECONDS / 86400:,.0f}; raise trace.speedup or cut the trace (timestamps are ms)")
    return [TraceRow((ts - t0) / 1000.0 / speedup, n_in, n_out, ids) for ts, n_in, n_out, ids in raw]
