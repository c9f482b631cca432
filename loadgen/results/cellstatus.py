"""A cell's status line in ``cells.jsonl`` (``CellStatus``) and the server it ran on
(``ServerInfo``, also each cell's ``server`` in ``summary.json``): fixed schemas, typed here,
read back from files of any earlier version (unknown keys are ignored, missing ones default)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from loadgen.data import Unchecked


@dataclass(frozen=True, slots=True)
class SettingValues:
    """The settings preset an engine was launched with."""

    gpu_memory_utilization: float
    max_model_len: int
    enforce_eager: bool


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What the tables need to know of a cell's server: the engine loadgen launched (``backend``:
    an engine's name, or ``sim``), or a server at a given URL (``backend`` None)."""

    backend: str | None = None
    launched: bool = False
    model: str | None = None  # the id it serves (a catalogue alias, or /v1/models' id)
    checkpoint: str | None = None
    quant: str | None = None  # as launched, or as the scenario declares (target.quant)
    setting: str | None = None
    setting_values: SettingValues | None = None
    device: str | None = None  # cuda | cpu
    gpus: tuple[int, ...] = ()
    gpu_count: int | None = None
    tp: int | None = None
    pp: int | None = None
    attn: str | None = None
    load_in: str | None = None
    grad_mode: str | None = None
    version: str | None = None  # what the engine says it is
    base_url: str | None = None  # a given server's URL (credentials removed)
    owned_by: str | None = None  # a given server: the owner its /v1/models names

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["gpus"] = list(self.gpus)
        return out

    @classmethod
    def from_dict(cls, data: object) -> ServerInfo:
        if not isinstance(data, dict):
            return cls()
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        if isinstance(values.get("setting_values"), dict):
            s = values["setting_values"]
            values["setting_values"] = SettingValues(
                float(s.get("gpu_memory_utilization", 0.0)), int(s.get("max_model_len", 0)),
                bool(s.get("enforce_eager", False)),
            )
        values["gpus"] = tuple(values.get("gpus") or ())
        values["launched"] = bool(values.get("launched", False))
        return cls(**values)


@dataclass(frozen=True, slots=True)
class SearchProbe:
    """Which capacity search a probe cell belongs to, and the load it probes."""

    search: int
    value: float


@dataclass(frozen=True, slots=True)
class EarlyStop:
    """Why a search's probe was stopped before its planned end: the objective it broke."""

    objective: str
    reason: str


@dataclass(frozen=True, slots=True)
class AppliedUsers:
    """The Locust users a test (or a step of its shape) actually ran: from how many to its peak,
    how long the ramp to the peak took, the time-weighted mean, and how long it lasted."""

    test: int  # the test's number in the run, from 1
    first: int
    peak: int
    mean: float
    ramp_s: float
    duration_s: float

    def text(self) -> str:
        # a ramp shorter than a tenth of a second is the spawn of users at once
        ramp = (f"{self.first} to {self.peak} users over {self.ramp_s:.1f} s"
                if self.first != self.peak and self.ramp_s >= 0.1 else f"{self.peak} users")
        return f"Locust test {self.test}: {ramp}, mean {self.mean:.1f} over {self.duration_s:.1f} s"

    @classmethod
    def from_dict(cls, data: object) -> AppliedUsers | None:
        if not isinstance(data, dict):
            return None
        return cls(int(data["test"]), int(data["first"]), int(data["peak"]), float(data["mean"]),
                   float(data["ramp_s"]), float(data["duration_s"]))


@dataclass(frozen=True, slots=True)
class LostWorker:
    """A Locust worker that stopped answering its master's heartbeats during the cell (its
    process killed, its machine gone): the records it had not yet reported are not in the run."""

    worker: int  # its index in the run's records (from 1)
    node: str  # Locust's id of it
    at_s: float  # when the master found it missing, in seconds into the Locust test
    users: int  # its users at its last report
    unreported_s: float | None  # from its last report to then (None: it never reported)

    def warning(self) -> str:
        since = ("it never reported" if self.unreported_s is None
                 else f"its last report came {self.unreported_s:.1f} s before")
        return (f"worker {self.worker} ({self.node}, {self.users} users) stopped answering its master "
                f"{self.at_s:.1f} s into the test ({since}): the requests it sent since its last report "
                "have no record, and the cell's figures count only what it reported; the other workers went on")

    @classmethod
    def from_dict(cls, data: Unchecked) -> LostWorker:
        unreported = data.get("unreported_s")
        return cls(int(data["worker"]), str(data["node"]), float(data["at_s"]), int(data["users"]),
                   None if unreported is None else float(unreported))


@dataclass(frozen=True, slots=True)
class CellStatus:
    """One line of ``cells.jsonl``: how a cell ended, on which server."""

    cell: int
    # started (a search's probe, before its end), done, failed, skipped, interrupted, or
    # set-aside (a cell a --resume measures again)
    status: str
    reason: str | None = None
    server: ServerInfo | None = None
    probe: SearchProbe | None = None
    stopped_early: EarlyStop | None = None
    # the chat template's tokens in every prompt (the text calibration's overhead)
    template_tokens: float | None = None
    cache_reset: str | None = None  # how the engine's prefix cache was emptied before the cell
    # measured requests of the cell whose record could not be written (a full or read-only disk)
    records_lost: int = 0
    users: AppliedUsers | None = None  # a Locust test's users as they ran
    workers_lost: tuple[LostWorker, ...] = ()  # Locust workers gone during the cell

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"cell": self.cell, "status": self.status}
        if self.status not in ("started", "set-aside"):
            out["reason"] = self.reason
            out["server"] = (self.server or ServerInfo()).to_dict()
        for name in ("probe", "stopped_early", "users"):
            if (value := getattr(self, name)) is not None:
                out[name] = asdict(value)
        for name in ("template_tokens", "cache_reset"):
            if (value := getattr(self, name)) is not None:
                out[name] = value
        if self.records_lost:
            out["records_lost"] = self.records_lost
        if self.workers_lost:
            out["workers_lost"] = [asdict(w) for w in self.workers_lost]
        return out

    @classmethod
    def from_dict(cls, data: Unchecked) -> CellStatus:
        probe, early = data.get("probe"), data.get("stopped_early")
        return cls(
            cell=int(data["cell"]), status=str(data["status"]), reason=data.get("reason"),
            server=ServerInfo.from_dict(data["server"]) if "server" in data else None,
            probe=SearchProbe(int(probe["search"]), float(probe["value"])) if isinstance(probe, dict) else None,
            stopped_early=EarlyStop(str(early.get("objective")), str(early.get("reason")))
            if isinstance(early, dict) else None,
            template_tokens=data.get("template_tokens"), cache_reset=data.get("cache_reset"),
            records_lost=int(data.get("records_lost") or 0), users=AppliedUsers.from_dict(data.get("users")),
            workers_lost=tuple(LostWorker.from_dict(w) for w in data.get("workers_lost") or ()),
        )
