"""What ``docker compose config`` does to a compose file, for machines without the compose
plugin: variable interpolation (``$$``, ``${VAR}``, ``:-``, ``-``, ``:?``, ``?``, ``:+``, ``+``,
nested defaults), ``extends`` across files, then the result is checked against the Compose
Specification's JSON schema as vendored by check-jsonschema."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# keys whose lists replace the base's under `extends`; every other list is appended to
REPLACED_LISTS = {"command", "entrypoint", "test"}


class InterpolationError(ValueError):
    pass


def interpolate(text: str, env: Mapping[str, str]) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "$":
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1:i + 2]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "{":
            depth, j = 1, i + 2
            while j < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                j += 1
            if depth:
                raise InterpolationError(f"unclosed ${{ in {text!r}")
            out.append(_braced(text[i + 2:j - 1], env))
            i = j
        elif m := NAME.match(text, i + 1):
            out.append(env.get(m.group(), ""))
            i = m.end()
        else:
            out.append("$")
            i += 1
    return "".join(out)


def _braced(inner: str, env: Mapping[str, str]) -> str:
    m = NAME.match(inner)
    if m is None:
        raise InterpolationError(f"bad variable ${{{inner}}}")
    name, rest = m.group(), inner[m.end():]
    value = env.get(name)
    for op in (":-", ":?", ":+", "-", "?", "+"):
        if rest.startswith(op):
            arg = rest[len(op):]
            empty = value is None or (op.startswith(":") and value == "")
            if op.endswith("-"):
                return interpolate(arg, env) if empty else value or ""
            if op.endswith("?"):
                if empty:
                    raise InterpolationError(f"{name}: {interpolate(arg, env)}")
                return value or ""
            return "" if empty else interpolate(arg, env)
    if rest:
        raise InterpolationError(f"bad variable ${{{inner}}}")
    return value or ""


def _walk(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_walk(x, env) for x in node]
    if isinstance(node, dict):
        return {k: _walk(v, env) for k, v in node.items()}
    return node


def _merge(base: Any, child: Any, key: str = "") -> Any:
    if isinstance(base, dict) and isinstance(child, dict):
        merged = dict(base)
        for k, v in child.items():
            merged[k] = _merge(base[k], v, k) if k in base else v
        return merged
    if isinstance(base, list) and isinstance(child, list) and key not in REPLACED_LISTS:
        return base + [x for x in child if x not in base]
    return child


# service fields compose converts to numbers after interpolation (those these files use)
TYPED: dict[tuple[str, str], type] = {("deploy", "replicas"): int, ("healthcheck", "retries"): int}


def load(path: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """The compose file as compose resolves it: interpolated, every ``extends`` merged in,
    numeric fields converted."""
    data = _walk(yaml.safe_load(path.read_text()), env)
    for name, service in list(data.get("services", {}).items()):
        service = _resolve(service, path, env)
        for (section, key), kind in TYPED.items():
            value = service.get(section, {}).get(key)
            if isinstance(value, str):
                try:
                    service[section][key] = kind(value)
                except ValueError:
                    raise InterpolationError(f"services.{name}.{section}.{key}: {value!r} is not a number") from None
        data["services"][name] = service
    return data


def _resolve(service: dict[str, Any], path: Path, env: Mapping[str, str]) -> dict[str, Any]:
    ext = service.get("extends")
    if ext is None:
        return service
    base_path = (path.parent / ext["file"]) if "file" in ext else path
    base_doc = _walk(yaml.safe_load(base_path.read_text()), env)
    base = _resolve(base_doc["services"][ext["service"]], base_path, env)
    child = {k: v for k, v in service.items() if k != "extends"}
    return _merge(base, child)


def schema_errors(project: dict[str, Any], tmp: Path) -> str:
    """check-jsonschema's verdict on the resolved project ('' when valid)."""
    doc = tmp / "resolved.json"
    doc.write_text(json.dumps(project))
    proc = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(doc)],
        capture_output=True, text=True, check=False,
    )
    return "" if proc.returncode == 0 else proc.stdout + proc.stderr
