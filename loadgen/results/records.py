"""``RequestRecord``: one line of ``records.jsonl`` per request, written as it completes.

Times ending in ``_at`` are seconds on the monotonic clock, measured from the run's clock
base (``provenance.json: clock_base_ns``, a ``time.perf_counter_ns()`` reading, which is
system-wide on Linux so worker processes share it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import orjson

from loadgen.data import Unchecked
from loadgen.errors import OutputError, RunDirError
from loadgen.results.files import AppendFile

FailureClass = Literal[
    "http_status",  # the server answered with status >= 400
    "timeout",  # connect, first-token, between-tokens or total timeout
    "connect",  # connection refused / could not be opened
    "client",  # the client itself ran out (open files, buffers) before the request left
    "reset",  # connection closed or reset before the response headers
    "stream_cut",  # the body ended or broke before the stream was complete
    "malformed",  # a chunk that is not the JSON an OpenAI-compatible server sends
    "stream_error",  # an error object sent inside a 200 stream
    "usage_invalid",  # usage with impossible token counts (negative, not a number, beyond max_tokens)
    "overrun",  # far more tokens streamed than max_tokens allows: the stream was ended
    "cancelled",  # the run was stopped (Ctrl-C, SIGTERM, abort) while it was in flight
]

# the fields of a record that are times on the run's clock (seconds after its clock base)
RECORD_TIMES: tuple[str, ...] = ("scheduled_at", "sent_at", "first_token_at", "last_token_at", "done_at")

TokenSource = Literal["usage", "tokenizer", "chunks"]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    request_id: int
    cell: int
    warmup: bool
    scheduled_at: float
    sent_at: float | None
    first_token_at: float | None
    last_token_at: float | None
    done_at: float | None
    # requested lengths (input None for prompts taken verbatim from a file)
    input_tokens: int | None
    max_tokens: int
    # the server's usage.prompt_tokens, when it sent usage
    prompt_tokens: int | None
    output_tokens: int
    token_count_source: TokenSource
    # tokens summed over chunks (per-chunk usage, else one per token-bearing chunk)
    chunk_tokens_total: int
    # arrival of each token-bearing chunk, seconds after sent_at, and the tokens it carried
    chunk_offsets_s: tuple[float, ...] = ()
    chunk_tokens: tuple[int, ...] = ()
    status: int | None = None
    error: FailureClass | None = None
    error_detail: str | None = None
    worker: int = 0
    # seconds between scheduled_at and the moment a concurrency slot was free: waiting for an
    # earlier request of ours to finish, not lateness of the client (send lag is the rest)
    slot_wait_s: float = 0.0
    # a reasoning model: when the first answer token (not thinking) came, and the thinking tokens
    first_answer_at: float | None = None
    reasoning_tokens: int = 0
    # the server's usage.prompt_tokens_details.cached_tokens, where it reports them
    cached_tokens: int | None = None
    # multi-turn sessions: the turn this request is (0-based); request_id = session * turns + turn
    turn: int | None = None
    # staged load: the stage the request was sent in (0-based)
    stage: int | None = None
    # structured output (workload.response_format): the answer parsed as JSON and met its schema
    valid_json: bool | None = None
    # tool calls (workload.tools): when the first token of a tool call came, and the tokens they took
    first_tool_call_at: float | None = None
    tool_call_tokens: int = 0
    # agent sessions from a file: the answer called the functions the turn expected (None: not said)
    expected_tool_call: bool | None = None
    image_bytes: int = 0  # workload.images: the bytes of the images the request carried
    embeddings: int = 0  # target.api embeddings: the vectors the answer held (it streams no token)
    # times it was sent again on a new connection, the kept-alive one having been closed by the
    # server before any byte of the answer (its times are the first attempt's)
    retries: int = 0
    # kernel-timed reads (load.clock): the longest the client took to handle one of its reads
    # after the kernel received it, seconds (None: timed by the loop's clock); the reads that
    # carried more than one token-bearing event (their tokens share the read's time)
    client_delay_s: float | None = None
    coalesced_reads: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def answered(self) -> bool:
        """A success with an answer: tokens streamed, or an embeddings answer's vectors."""
        return self.error is None and (self.first_token_at is not None or self.embeddings > 0)

    # the per-request latencies, in seconds (None where the request got that far), each defined here once

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: its arrival minus the send."""
        if self.first_token_at is None or self.sent_at is None:
            return None
        return self.first_token_at - self.sent_at

    @property
    def ttft_from_schedule_s(self) -> float | None:
        """Time to first token from the moment the schedule meant the request to go out."""
        return None if self.first_token_at is None else self.first_token_at - self.scheduled_at

    @property
    def e2e_s(self) -> float | None:
        """End-to-end latency: the end of the answer minus the send."""
        if self.done_at is None or self.sent_at is None:
            return None
        return self.done_at - self.sent_at

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (last token - first token) / (tokens - 1)."""
        if self.output_tokens < 2 or self.first_token_at is None or self.last_token_at is None:
            return None
        return (self.last_token_at - self.first_token_at) / (self.output_tokens - 1)

    def meets(self, limits: Mapping[str, float]) -> bool:
        """Whether the request answered within per-request bounds in ms (``ttft_ms``, ``tpot_ms``,
        ``e2e_ms``; each optional): the one SLO check of goodput, the search and its early stop.
        A request that did not finish meets none."""
        ttft, e2e, tpot = self.ttft_s, self.e2e_s, self.tpot_s
        if e2e is None or (ttft is None and (not self.embeddings or "ttft_ms" in limits)):
            return False  # (an embeddings answer has no first token: only its E2E is judged)
        return not (
            (ttft is not None and ttft * 1e3 > limits.get("ttft_ms", math.inf))
            or (tpot is not None and tpot * 1e3 > limits.get("tpot_ms", math.inf))
            or e2e * 1e3 > limits.get("e2e_ms", math.inf)
        )

    def to_json(self) -> bytes:
        return orjson.dumps(self) + b"\n"

    @classmethod
    def from_dict(cls, data: Unchecked) -> RequestRecord:
        data["chunk_offsets_s"] = tuple(data.get("chunk_offsets_s", ()))
        data["chunk_tokens"] = tuple(data.get("chunk_tokens", ()))
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class RecordWriter:
    """Appends records to ``records.jsonl``, each line with one system call, so a crash loses
    none. A record that cannot be written (disk full, read-only) raises ``OutputError`` and is
    counted in ``lost``: the run stops and says so."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = AppendFile(path)
        self.count = 0
        self.lost = 0

    def write(self, record: RequestRecord) -> None:
        try:
            self._file.append(record.to_json())
        except OutputError:
            self.lost += 1
            raise
        self.count += 1

    @property
    def position(self) -> int:
        """The byte offset the next record starts at (where a cell's records begin)."""
        return self._file.size

    def close(self) -> None:
        self._file.close()


class UnreadableRecord(RunDirError):
    """A line of ``records.jsonl`` that is not a request record; the message names the line."""


def read_records(path: Path, offset: int = 0) -> Iterator[RequestRecord]:
    """Records from a ``records.jsonl`` (from byte ``offset``); a last line cut short by a
    crash is skipped; any other line that is not a record raises ``UnreadableRecord``."""
    with path.open("rb") as f:
        f.seek(offset)
        for number, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                break
            try:
                yield RequestRecord.from_dict(orjson.loads(line))
            except (orjson.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError) as exc:
                where = f"line {number}" if offset == 0 else f"line {number} after byte {offset}"
                raise UnreadableRecord(f"{where} is not a request record ({exc})") from None
