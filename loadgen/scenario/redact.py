"""Credentials never reach the run directory: every header value and the user information of
every URL are redacted wherever a scenario, a command line or a URL is written down (one
module, used by every writer)."""

from __future__ import annotations

import re
from collections.abc import Callable

import yaml

from loadgen.data import Labels, Unchecked
from loadgen.scenario.schema import Scenario
from loadgen.scenario.wire import ENV_REF, REDACTED, redact_url

__all__ = ["REDACTED", "SECRET_FLAGS", "dump_scenario", "redact_argv", "redact_labels", "redact_url", "secret_flags"]

# an engine's flags whose value is a secret (vLLM's, SGLang's, TGI's and llama.cpp's own)
SECRET_FLAGS = ("--api-key", "--admin-api-key", "--hf-token", "--token")


def secret_flags(argv: list[str] | tuple[str, ...]) -> dict[int, str]:
    """The positions in ``argv`` that hold a secret, each with its flag: the value after
    ``--api-key`` (and the others of SECRET_FLAGS), or the whole ``--api-key=VALUE``."""
    found: dict[int, str] = {}
    for i, arg in enumerate(argv):
        flag, eq, _ = arg.partition("=")
        if flag in SECRET_FLAGS:
            if eq:
                found[i] = flag
            elif i + 1 < len(argv):
                found[i + 1] = flag
    return found


def redact_secret_flags(argv: list[str] | tuple[str, ...]) -> list[str]:
    """``argv`` with the value of every secret flag replaced."""
    secret = secret_flags(argv)
    return [(f"{secret[i]}={REDACTED}" if "=" in a else REDACTED) if i in secret else a for i, a in enumerate(argv)]


def is_header_key(key: str) -> bool:
    """A dotted scenario key that sets a request header (``target.headers.X``) or all of them."""
    parts = key.split(".")
    return "headers" in parts


def redact_labels(labels: Labels) -> Labels:
    """Matrix values by axis, a header axis's value redacted."""
    return {k: (REDACTED if is_header_key(k) else v) for k, v in labels.items()}


def header_variable(name: str) -> str:
    """The environment variable a saved scenario reads header ``name`` from."""
    return "LOADGEN_HEADER_" + re.sub(r"[^A-Za-z0-9]+", "_", name).upper().strip("_")


def _redact_data(data: Unchecked, *, references: bool = False) -> Unchecked:
    def hidden(name: str, value: object) -> object:
        if isinstance(value, str) and ENV_REF.match(value):
            return value  # a reference to a variable, not a secret
        return f"${{{header_variable(name)}}}" if references else REDACTED

    data = _with_headers(data, hidden)
    target = data.get("target") or {}
    if isinstance(target.get("base_url"), str):
        target["base_url"] = redact_url(target["base_url"])
    serve = data.get("serve") or {}
    if isinstance(serve.get("extra_args"), list):
        serve["extra_args"] = redact_secret_flags(serve["extra_args"])
    return data


def _with_headers(data: Unchecked, value_for: Callable[[str, object], object]) -> Unchecked:
    """``data`` (a scenario's keys) with every header value, literal or a matrix axis's, replaced
    by ``value_for(name or axis, value)``."""
    target = data.get("target") or {}
    for name, value in (target.get("headers") or {}).items():
        target["headers"][name] = value_for(name, value)
    matrix = data.get("matrix")
    for block in matrix if isinstance(matrix, list) else [matrix] if isinstance(matrix, dict) else []:
        axes = block.get("axes") or {}
        for axis in axes:
            if is_header_key(axis) and isinstance(axes[axis], list):
                axes[axis] = [value_for(axis, v) for v in axes[axis]]
        for rule in block.get("overrides") or []:
            for key in list(rule.get("set") or {}):
                if is_header_key(key):
                    rule["set"][key] = value_for(key, rule["set"][key])
    return data


def as_recorded(data: Unchecked) -> Unchecked:
    """A run directory's scenario, read to report on it: the headers loadgen redacted when it
    wrote the file stand as a plain placeholder (they are never sent from here)."""
    return _with_headers(data, lambda _, v: "redacted" if v == REDACTED else v)


def dump_scenario(scenario: Scenario, *, references: bool = False) -> str:
    """The scenario as resolved (defaults filled in), as YAML, every header value and URL
    password redacted (keys belong in the variable target.api_key_env names); ``references``:
    a header value becomes ``${LOADGEN_HEADER_NAME}``, read from that variable when the file runs."""
    return yaml.safe_dump(_redact_data(scenario.model_dump(mode="json"), references=references), sort_keys=False)


def header_variables(scenario: Scenario) -> list[str]:
    """The variables a scenario saved with references needs set (one per literal header)."""
    return [header_variable(n) for n, v in scenario.target.headers.items() if not ENV_REF.match(v)]


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with header values given by --set (either form) or by ``bench serve``'s
    --header (``NAME=VALUE``, one or more after it), whole header mappings, an engine's secret
    flags (``--api-key``) and URL passwords replaced."""
    out = []
    pending = ""  # the flag whose values come next: --set (one), --header (until the next flag)
    for arg in redact_secret_flags(argv):
        text = arg
        if arg.startswith("--set="):
            text = "--set=" + _redact_set(arg[len("--set="):])
        elif arg.startswith("--header="):
            text = "--header=" + _redact_header(arg[len("--header="):])
        elif pending == "--set":
            text = _redact_set(arg)
        elif pending == "--header" and not arg.startswith("-"):
            text = _redact_header(arg)
        if arg in ("--set", "--header"):
            pending = arg
        elif not (pending == "--header" and not arg.startswith("-")):
            pending = ""
        out.append(redact_url(text))
    return out


def _redact_header(pair: str) -> str:
    name, sep, _ = pair.partition("=")
    return f"{name}={REDACTED}" if sep else REDACTED


def _redact_set(value: str) -> str:
    key, sep, _ = value.partition("=")
    if sep and is_header_key(key.strip()):
        return f"{key}={REDACTED}"
    return value
