"""``provenance.json``: where and how a run was made, and what it learnt on the way (the model
served, the text calibration, the engines launched, the client's cores). A ``Provenance`` is
changed through its named methods and written only by the run directory's writer
(``RunDirWriter.write_provenance``)."""

from __future__ import annotations

import getpass
import platform
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from loadgen import __version__
from loadgen.data import Unchecked
from loadgen.results.cellstatus import ServerInfo
from loadgen.scenario.redact import redact_argv
from loadgen.scenario.schema import Scenario


def _now() -> str:
    return datetime.now(UTC).isoformat()


# what an engine says of itself (its /version, /info or /props answer, scalars only): its keys are its own
EngineSays = dict[str, str | int | float | bool | None]


@dataclass
class LaunchRecord:
    """An engine (or the simulator) loadgen launched (``provenance.json: server``, and each of
    ``servers``), filled in as the launch goes on: the command, the process id, readiness and
    what the engine says of itself."""

    backend: str
    argv: list[str]
    command: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    device: str | None = None
    model: str | None = None
    served_model_name: str | None = None
    quant: str | None = None
    setting: str | None = None
    tp: int | None = None
    pp: int | None = None
    gpus: list[dict[str, object]] | None = None  # each GPU checked before launch, as NVML describes it
    spec: ServerInfo | None = None  # the resolved configuration, as the tables show it
    log: str | None = None
    pid: int | None = None
    ready_s: float | None = None
    engine: EngineSays | None = None

    @property
    def version(self) -> str | None:
        version = (self.engine or {}).get("version")
        return str(version) if version else None

    def to_dict(self) -> dict[str, object]:
        out = {k: v for k, v in asdict(self).items() if v is not None and k != "spec"}
        if self.spec is not None:
            out["spec"] = self.spec.to_dict()
        return out


@dataclass(frozen=True, slots=True)
class Placement:
    """The cores the client and the engine were given (``provenance.json: cpus``), and why."""

    engine: tuple[int, ...]
    client: tuple[int, ...]
    how: str


class Provenance:
    def __init__(self, data: Unchecked) -> None:
        # a JSON object: beside loadgen's own keys it holds what servers said of themselves
        # (their /v1/models answer, an engine's /version), whose keys are theirs
        self._data = data
        self._launched: list[LaunchRecord] = []  # this process's launches, written as they stand

    @classmethod
    def new(cls, scenario: Scenario, **extra: object) -> Provenance:
        """What every run directory says of where and how it was made (``extra``: the Locust side's)."""
        return cls({
            "loadgen_version": __version__,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "host": socket.gethostname(),
            "user": getpass.getuser(),
            "argv": redact_argv(sys.argv),
            "seed": scenario.seed,
            "start_wall": _now(),
            **extra,
        })

    def to_dict(self) -> dict[str, object]:
        if not self._launched:
            return self._data
        earlier = self._data.get("servers") or []  # a resumed run's, as its file holds them
        launched = [r.to_dict() for r in self._launched]
        return {**self._data, "server": launched[-1], "servers": [*earlier, *launched]}

    # what a run learns, in the order it learns it

    def resumed(self) -> None:
        self._data.setdefault("resumed_wall", []).append(_now())

    def clock_base_ns(self) -> int:
        """The run's clock base (``perf_counter_ns`` at its first measured server), set once."""
        base: int = self._data.setdefault("clock_base_ns", time.perf_counter_ns())
        return base

    def launched(self, server: LaunchRecord) -> None:
        """An engine (or the simulator) loadgen launched: the current one, and the list of all.
        ``server`` is updated in place as the launch goes on (its pid, readiness, version)."""
        self._launched.append(server)

    def placed(self, cpus: Placement) -> None:
        """The cores the client and the engine were given."""
        self._data["cpus"] = {"engine": list(cpus.engine), "client": list(cpus.client), "how": cpus.how}

    def server_models(self, answer: object) -> None:
        """The server's ``/v1/models`` answer, as it gave it (or ``{"error": ...}``)."""
        self._data["server_models"] = answer

    def served_model(self, model: str | None) -> None:
        self._data["model"] = model

    def text_calibration(self, overhead: float, per_word: float) -> None:
        self._data["text_calibration"] = {"overhead": overhead, "per_word": per_word}

    def params_dropped(self, params: list[str], reason: str) -> None:
        self._data["params_dropped"] = {"params": params, "reason": reason}

    def closes_connections(self, why: str) -> bool:
        """The server closes its connections after each answer, so none is reused
        (``connections``); True when this is news (told once)."""
        if self._data.get("connections") is not None:
            return False
        self._data["connections"] = {"reuse": False, "why": why}
        return True

    def note(self, **values: object) -> None:
        """Facts of the run beside the others (a Locust run's workers, the clock that timed the bytes)."""
        self._data.update(values)

    def ended(self) -> None:
        self._data["end_wall"] = _now()

    # what is read back

    @property
    def model(self) -> str | None:
        model = self._data.get("model")
        return model if isinstance(model, str) else None

    @property
    def times_resumed(self) -> int:
        resumed = self._data.get("resumed_wall")
        return len(resumed) if isinstance(resumed, list) else 0

    @property
    def models_answer(self) -> object:
        return self._data.get("server_models")

    @property
    def template_tokens(self) -> float | None:
        """The text calibration's overhead: the chat template's tokens in every prompt."""
        calibration = self._data.get("text_calibration")
        return None if not isinstance(calibration, dict) else calibration.get("overhead")
