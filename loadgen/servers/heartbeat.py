"""No silent minutes: a wait longer than a few seconds (an install, a build, an engine starting)
says every few seconds what it waits for, how long it has waited, and what it can tell of
the progress (a directory's size, the engine log's phase)."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from loadgen.errors import LaunchError

Echo = Callable[[str], None]

# how often a wait says where it is
EVERY_S = 5.0


def tree_bytes(path: Path) -> int:
    """Bytes under ``path`` (files only, links not followed); 0 when it does not exist."""
    total = 0
    stack = [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(Path(entry.path))
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            continue
    return total


def size_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit in ("B", "KiB") else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Heartbeat:
    """While open, ``echo`` gets ``"<what>: <elapsed> s<detail>"`` every ``every_s`` seconds,
    ``detail()`` giving what it can tell of the progress (e.g. ``", 1.2 GiB so far"``)."""

    def __init__(self, echo: Echo, what: str, detail: Callable[[], str] | None = None, every_s: float = EVERY_S,
                 ) -> None:
        self.echo, self.what, self.detail, self.every_s = echo, what, detail, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self.t0 = time.monotonic()

    def __enter__(self) -> Heartbeat:
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            extra = ""
            if self.detail is not None:
                try:
                    extra = self.detail()
                except (OSError, ValueError):  # a progress detail never breaks what it reports on
                    extra = ""
            self.echo(f"{self.what}: {time.monotonic() - self.t0:.0f} s{extra}")


def run_step(echo: Echo, argv: list[str] | tuple[str, ...], what: str, *, grows: Path | None = None,
             fail: str = "", quiet: bool = False) -> None:
    """Run ``argv`` (its output to the terminal, or with ``quiet`` shown only if it fails: a check
    whose warnings are not the user's business), saying every few seconds what it does and, with
    ``grows``, how large that directory has become; a non-zero exit is a LaunchError."""
    echo(f"{what} ...")
    base = tree_bytes(grows) if grows is not None else 0

    def detail() -> str:
        return f", {size_text(tree_bytes(grows) - base)} written" if grows is not None else ""

    with Heartbeat(echo, what, detail, every_s=EVERY_S):
        proc = subprocess.run(list(argv), check=False, capture_output=quiet, text=quiet)
    if proc.returncode != 0:
        said = "\n".join(((proc.stdout or "") + (proc.stderr or "")).splitlines()[-20:]) if quiet else ""
        raise LaunchError(f"{fail or what}: `{' '.join(argv)}` exited with status {proc.returncode}", said)


# what an engine's log says it is doing while it starts, newest first wins (vLLM, SGLang, TGI,
# llama.cpp and loadgen's own engines use these words)
PHASES: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p, re.IGNORECASE), name) for p, name in (
    (r"uvicorn running|application startup complete|starting vllm (api )?server|server is listening|"
     r"http server listening|connected$", "starting its HTTP server"),
    (r"cuda graph|capturing|compil|warming up|warmup|torch\.compile|inductor", "compiling and warming up"),
    (r"kv cache|num_gpu_blocks|cache_config|memory profiling|profil", "sizing the KV cache"),
    (r"loading weights|load weights|loading safetensors|loading checkpoint|llama_model_load|load(ing)? (the )?model|"
     r"model loading|safetensors", "loading the weights"),
    (r"initializing|init engine|engine core|non-default args|starting", "initialising"),
))


# lines that name a phase without being in it: a step that is over ("Loading weights took
# 0.03 seconds", vLLM's "init engine (profile, create kv cache, warmup model) took 2.94 s", which
# turned the label back to compiling once the engine was done) or one that is switched off
# ("Enforce eager set, disabling torch.compile", which read as compiling for the 30 s before
# the weights)
NOT_A_PHASE = re.compile(r"\btook\b|disabl", re.IGNORECASE)


def phase(log_tail: str) -> str | None:
    """The phase the newest line of an engine log that names one says it is in."""
    for line in reversed(log_tail.splitlines()):
        if NOT_A_PHASE.search(line):
            continue
        for pattern, name in PHASES:
            if pattern.search(line):
                return name
    return None


def _starts_file() -> Path:
    from loadgen.servers.tiny import cache_root

    return cache_root() / "starts.json"


def start_key(argv: tuple[str, ...] | list[str]) -> str:
    """An engine's command line without its port (which is new on every launch)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in ("--port", "-p"):
            skip = True
            continue
        if not arg.startswith("--port="):
            out.append(arg)
    return " ".join(out)


def last_start(key: str) -> float | None:
    """Seconds the same engine command took to be ready last time on this machine."""
    import json

    try:
        value = json.loads(_starts_file().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) else None


def note_start(key: str, seconds: float) -> None:
    """Remember how long the engine command took to be ready (the next start says it)."""
    import json

    path = _starts_file()
    try:
        data = json.loads(path.read_text()) if path.exists() else {}
        if not isinstance(data, dict):
            data = {}
        data[key] = round(seconds, 1)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    except (OSError, ValueError):
        return  # a hint, never a failure
