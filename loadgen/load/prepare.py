"""What a run settles before it measures: the seed its prompts are drawn from, the run
directory it continues, the model it sends; and what it tells its front end as it goes."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

from loadgen.errors import RunDirError, TargetError, UsageError
from loadgen.load.client import StreamingClient
from loadgen.load.sse import CHUNK_READER
from loadgen.load.target import pick_model, token_counter
from loadgen.results.provenance import Provenance
from loadgen.results.records import RequestRecord
from loadgen.results.rundir import (
    PROVENANCE,
    SCENARIO,
    read_cell_status,
    read_json,
    set_aside_records,
    stored_seed,
)
from loadgen.results.summary import CellSummary, Summary
from loadgen.scenario.matrix import Cell
from loadgen.scenario.redact import dump_scenario
from loadgen.scenario.schema import Scenario
from loadgen.scenario.wire import redact_url
from loadgen.workload.images import directory_files
from loadgen.workload.prompts import Sources, read_sources


class Observer(Protocol):
    """What a front end (the CLI's progress bar) is told while a run goes on."""

    def message(self, text: str) -> None: ...
    # a cell's requests being made ahead of its window (told only while more than a slice is left)
    def preparing(self, cell: Cell, made: int, total: int, cells: int) -> None: ...
    def cell_started(self, cell: Cell, total: int | None, cells: int) -> None: ...
    def record(self, record: RequestRecord) -> None: ...
    def cell_finished(self, cell: Cell, summary: CellSummary) -> None: ...


class QuietObserver:
    def message(self, text: str) -> None:
        pass

    def preparing(self, cell: Cell, made: int, total: int, cells: int) -> None:
        pass

    def cell_started(self, cell: Cell, total: int | None, cells: int) -> None:
        pass

    def record(self, record: RequestRecord) -> None:
        pass

    def cell_finished(self, cell: Cell, summary: CellSummary) -> None:
        pass


@dataclass(frozen=True, slots=True)
class RunResult:
    run_dir: Path
    summary: Summary
    interrupted: bool
    aborted: str | None = None  # the abort rule that ended the run, in words


def with_run_seed(scenario: Scenario, resumed: Path | None, obs: Observer) -> Scenario:
    """The scenario with the seed its prompts and arrivals are drawn from: the one given, the
    resumed run's own, or a fresh one, so that no prompt repeats one of an earlier run that the
    server may still hold in its prefix cache."""
    if scenario.seed is not None:
        obs.message(
            f"seed {scenario.seed}: the prompts are those of every run with this seed, and a server with "
            "prefix caching may answer them from its cache (its hit rate is reported per cell)"
        )
        return scenario
    seed = stored_seed(resumed) if resumed is not None else None
    return scenario.model_copy(update={"seed": secrets.randbits(63) if seed is None else seed})


def reopen(scenario: Scenario, run_dir: Path, retry_failed: bool) -> tuple[Provenance, set[int], list[int]]:
    """An interrupted run directory to continue: its provenance (marked resumed), the cells it
    finished, and those measured again, whose records are set aside here (their status lines
    are the writer's to set aside)."""
    if not (run_dir / SCENARIO).is_file():
        raise UsageError(f"{run_dir}: --resume needs an existing run directory (no {SCENARIO} there)")
    if (run_dir / SCENARIO).read_text() != dump_scenario(scenario):
        raise UsageError(
            f"{run_dir}: --resume: the scenario differs from the one this run started with "
            f"({SCENARIO}); resume with the same file and --set values, or start a new run"
        )
    statuses = read_cell_status(run_dir)
    finished = {
        i for i, s in statuses.items() if s.status not in ("started", "set-aside")
        and (s.status == "done" or not retry_failed)
    }
    set_aside_records(run_dir, keep=finished)
    again = [i for i, s in sorted(statuses.items()) if i not in finished and s.status != "set-aside"]
    data = read_json(run_dir / PROVENANCE)
    if not isinstance(data, dict):
        raise RunDirError(f"{run_dir / PROVENANCE}: not a JSON object; restore it, or start a new run")
    provenance = Provenance(data)
    provenance.resumed()
    return provenance, finished, again


async def resolve_model(
    client: StreamingClient, base_url: str, wanted: str, provenance: Provenance
) -> str:
    """The model to ask for (``target.model``, or the server's first with ``auto``); the
    provenance notes the server's list, the clock that times the answers' bytes and what reads
    their chunks (compiled code, or Python where it was not built)."""
    provenance.note(client_clock={"clock": client.clock, "why_not_kernel": client.clock_note},
                    chunk_reader=CHUNK_READER)
    base_url = redact_url(base_url)  # what errors show: no user or password
    try:
        models = await client.fetch_models()
    except (httpx.HTTPError, ValueError) as exc:
        reason = redact_url((str(exc) or type(exc).__name__).splitlines()[0])  # httpx appends a line of help
        if "CERTIFICATE_VERIFY_FAILED" in reason:  # every request would fail the same way
            raise TargetError(
                f"{base_url}: the server's TLS certificate is not trusted ({reason}); if you trust this server, "
                "set target.verify_tls: false (loadgen bench serve: --insecure)"
            ) from exc
        if wanted == "auto":
            raise TargetError(
                f"{base_url}/models: cannot list models ({reason}); is an OpenAI-compatible "
                "server running there? (or set target.model to skip the lookup)"
            ) from exc
        provenance.server_models({"error": reason})
        return wanted
    provenance.server_models(models)
    return pick_model(models, wanted, f"{base_url}/models")


def session_seed(seed: int, resumed: int) -> int:
    """The seed a run's draws come from: the scenario's, or for its ``resumed``-th resumed session
    one derived from both (``SeedSequence([seed, resumed])``, as re-derivable as the seed itself)."""
    if resumed == 0:
        return seed
    import numpy as np

    return int(np.random.SeedSequence([seed, resumed]).generate_state(1, np.uint64)[0] >> 1)


def read_all_sources(points: list[Scenario], seed: int, message: Callable[[str], None]) -> dict[str, Sources]:
    """Every dataset and trace the run's points name, read once per distinct workload (what
    was skipped is said), before anything is launched or written."""
    out: dict[str, Sources] = {}
    for point in points:
        w = point.workload
        key = w.model_dump_json()
        if w.source == "generated" or key in out:
            continue
        counter = None
        if w.source in ("sharegpt", "hf"):
            counter, how = token_counter(point)
            message(f"dataset lengths counted {how}")
        out[key] = read_sources(point, seed, counter)
        for note in out[key].notes:
            message(f"dataset: {note}")
    for point in points:  # a directory's images, each checked once, before anything is launched
        if point.workload.images is not None and point.workload.images.directory is not None:
            directory_files(point.workload.images)
    for point in points:  # rows of chat messages go to chat or the Responses API only
        read = out.get(point.workload.model_dump_json())
        if read and point.target.api in ("completions", "embeddings") and any(
            s.prompt.messages is not None for s in read.samples
        ):
            where = point.workload.dataset.path if point.workload.dataset is not None else "the dataset"
            raise UsageError(f"{where}: its rows are chat messages, which target.api {point.target.api} cannot send; "
                             "set target.api: chat (or give each row a prompt)")
    return out
