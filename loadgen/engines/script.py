"""A launch as a standalone shell script (``loadgen serve ... --script``): the exact engine
command, its environment and GPU pinning, runnable without loadgen. The scripts in the
repository's top-level ``servers/`` are these files; a test regenerates each one from the
command on its second line and compares them byte for byte.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from loadgen.scenario.redact import secret_flags
from loadgen.servers.launch import LaunchSpec


def _program(argv0: str) -> str:
    """The program as a script on another machine finds it: this interpreter becomes
    ``$PYTHON`` (default python3); other absolute paths their name on ``PATH``."""
    if argv0 == sys.executable:
        return '"${PYTHON:-python3}"'
    if Path(argv0).is_absolute():
        return shlex.quote(Path(argv0).name)
    return shlex.quote(argv0)


def _one_line(text: str) -> str:
    """Text for a ``#`` comment: a line break in an argument would end the comment and run the
    rest as a command, so line breaks are written as ``\\n``."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _secret_variable(flag: str) -> str:
    """The variable a script reads a secret flag's value from: ``--api-key`` -> LOADGEN_ENGINE_API_KEY."""
    return "LOADGEN_ENGINE_" + flag.lstrip("-").replace("-", "_").upper()


def _script_arg(arg: str, secret_flag: str | None) -> str:
    if secret_flag is None:
        return shlex.quote(arg)
    var = _secret_variable(secret_flag)
    value = f'"${{{var}:?set {var} to the engine\'s {secret_flag}}}"'
    return f"{secret_flag}={value}" if "=" in arg else value


def launch_script(launch: LaunchSpec, command: str, about: str) -> str:
    """``#!/usr/bin/env bash``, the loadgen command that wrote it, what it starts, the
    environment as exports, then ``exec`` of the engine (extra arguments appended)."""
    lines = [
        "#!/usr/bin/env bash",
        f"# {_one_line(command)}",
        f"# {_one_line(about)}",
        f"# Serves an OpenAI-compatible API at {launch.base_url}; extra arguments go to the engine.",
        "set -euo pipefail",
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in launch.env.items()]
    # a secret flag's value is read from a variable when the script runs, never written in it
    secret = secret_flags(launch.argv)
    lines += [f"# set {_secret_variable(flag)} first (the engine's {flag}); the script reads it"
              for flag in sorted(set(secret.values()))]
    args = " ".join(_script_arg(a, secret.get(i)) for i, a in enumerate(launch.argv) if i > 0)
    lines.append(f'exec {_program(launch.argv[0])} {args} "$@"')
    return "\n".join(lines) + "\n"
