"""Credentials never reach the run directory: header values and URL passwords are redacted
wherever a scenario or a command line is written down."""

from __future__ import annotations

import re

import yaml

from loadgen.scenario.schema import Scenario

SECRET_HEADER = re.compile(r"authorization|api[-_]?key|token|secret|cookie|password", re.I)
REDACTED = "<redacted>"


def dump_scenario(scenario: Scenario) -> str:
    """The scenario as resolved (defaults filled in), as YAML; header values that carry
    credentials are written as <redacted> (keys belong in the variable target.api_key_env names)."""
    data = scenario.model_dump(mode="json")
    headers = data["target"]["headers"]
    for name in headers:
        if SECRET_HEADER.search(name):
            headers[name] = REDACTED
    return yaml.safe_dump(data, sort_keys=False)


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with the values of credential headers given by --set replaced."""
    out = []
    for arg in argv:
        key, sep, _ = arg.partition("=")
        if sep and ".headers." in key and SECRET_HEADER.search(key.rsplit(".", 1)[-1]):
            arg = f"{key}={REDACTED}"
        out.append(arg)
    return out
