"""``loadgen engines``: every engine of the cross-engine comparison, whether it is installed
here, how to install it, and what hardware it needs."""

from __future__ import annotations

from dataclasses import dataclass

from loadgen.engines.registry import ENGINES, NOT_LAUNCHABLE


@dataclass(frozen=True, slots=True)
class EngineInfo:
    name: str  # the --backend value ("" where loadgen cannot launch it)
    label: str
    hardware: str
    install: str
    installed: bool
    detail: str  # what was found, or why it cannot be used


def engines() -> list[EngineInfo]:
    """Every engine, in the order of the cross-engine table."""
    out = []
    for e in ENGINES:
        ok, detail = e.installed()
        out.append(EngineInfo(e.name, e.label, e.hardware, e.install, ok, detail))
    for label, (hardware, why) in NOT_LAUNCHABLE.items():
        out.append(EngineInfo("", label, hardware, "-", False, why))
    return out
