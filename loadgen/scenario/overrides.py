"""``--set`` overrides and matrix values applied to a scenario's raw data, and the one-line
form of a validation error (``file: a.b -> message; c -> message``)."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from loadgen.data import Unchecked
from loadgen.errors import ScenarioError, UsageError
from loadgen.scenario.schema import Scenario
from loadgen.scenario.yamlread import ScenarioYAMLError, read_yaml


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"load.concurrency=64"`` -> (["load", "concurrency"], 64); the value is read as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ScenarioError(f"--set {text!r}: expected dotted.key=value, e.g. load.concurrency=64")
    try:
        value = read_yaml(raw) if raw.strip() else None
    except (yaml.YAMLError, ScenarioYAMLError):
        raise ScenarioError(
            f"--set {key.strip()}: the value is not YAML; quote text (e.g. --set 'name=\"a: b\"')"
        ) from None
    return key.strip().split("."), value


def apply_overrides(
    data: Unchecked, overrides: list[str], values: Unchecked | None = None
) -> Unchecked:
    """Set ``--set`` texts and ``values`` (dotted key -> value) in ``data``, creating sections."""
    items = [parse_override(t) for t in overrides] + [(k.split("."), v) for k, v in (values or {}).items()]
    for path, value in items:
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[path[-1]] = value
    return data


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    model: Any = Scenario
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return []
    return sorted(getattr(model, "model_fields", {}))


def format_validation_error(source: str, exc: ValidationError) -> str:
    """One line: ``file: a.b -> message; c -> message``."""
    parts = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        field = ".".join(str(p) if str(p).isprintable() else repr(p) for p in loc) or "(top level)"
        msg = " ".join(err["msg"].removeprefix("Value error, ").split())
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(loc)
            msg = "unknown key" + (f"; allowed keys: {', '.join(allowed)}" if allowed else "")
        elif err["type"] not in ("value_error",) and "input" in err:
            shown = repr(err["input"])
            msg = f"{msg} (got {shown[:120] + ' ...' if len(shown) > 120 else shown})"
        parts.append(f"{field} -> {msg}")
    return f"{source}: " + "; ".join(parts)


def search_overrides(search: str | None, slos: list[str], confirm: int | None = None) -> list[str]:
    """``--search BY[:MIN:MAX]``, ``--slo METRIC:STAT:MS`` / ``--slo error_rate:SHARE`` and
    ``--confirm N`` as ``--set`` texts (each ``--slo`` latency replaces that latency's
    objectives in the file)."""
    out: list[str] = [] if confirm is None else [f"load.search.confirm={confirm}"]
    if search is not None:
        by, *bounds = search.split(":")
        if by not in ("concurrency", "rate") or len(bounds) not in (0, 2):
            raise UsageError(f"--search {search!r}: give concurrency or rate, optionally with MIN:MAX "
                             "(e.g. --search concurrency:1:256)")
        out.append(f"load.search.by={by}")
        if bounds:
            out += [f"load.search.min={bounds[0]}", f"load.search.max={bounds[1]}"]
    objectives: dict[str, dict[str, str]] = {}
    for text in slos:
        parts = text.split(":")
        name = parts[0].removesuffix("_ms")
        if name in ("error_rate", "errors") and len(parts) == 2:
            out.append(f"load.search.slo.error_rate={parts[1]}")
            continue
        if name not in ("ttft", "tpot", "itl", "e2e") or len(parts) != 3:
            raise UsageError(f"--slo {text!r}: give METRIC:STAT:MS (METRIC ttft, tpot, itl or e2e; e.g. "
                             "--slo ttft:p99:300) or error_rate:SHARE (e.g. --slo error_rate:0.01)")
        objectives.setdefault(f"{name}_ms", {})[parts[1]] = parts[2]
    for key, stats in objectives.items():
        flow = ", ".join(f"{stat}: {bound}" for stat, bound in stats.items())
        out.append(f"load.search.slo.{key}={{{flow}}}")
    return out
