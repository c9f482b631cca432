"""The API key is read from the variable the scenario names and is written nowhere: not in
the run directory, the server log, provenance, or an error message. Credential headers given
in a scenario or with --set are redacted where the run writes them."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[2]


def run(path: Path, out: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadgen", "run", str(path), "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, **env},
                          check=False)


def everything_written(run_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file())


def test_the_api_key_is_used_and_never_written(tmp_path: Path) -> None:
    key, header_secret = f"sk-{secrets.token_hex(16)}", f"hdr-{secrets.token_hex(16)}"
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "secrets",
        "serve": {"backend": "sim", "sim": {"ttft_ms": 5, "itl_ms": 1, "api_key_env": "LOADGEN_TEST_KEY"}},
        "target": {"api_key_env": "LOADGEN_TEST_KEY"},
        "workload": {"num_prompts": 6, "input_tokens": 8, "output_tokens": 4},
    }))
    out = tmp_path / "run"
    proc = run(path, out, {"LOADGEN_TEST_KEY": key}, "--set", f"target.headers.X-Api-Key={header_secret}")
    # the simulator demands the key: every request completing shows it was sent
    assert proc.returncode == 0, proc.stderr
    assert "completed 6/6" in proc.stdout
    written = everything_written(out)
    assert key.encode() not in written
    assert header_secret.encode() not in written
    assert b"X-Api-Key: <redacted>" in (out / "scenario.resolved.yaml").read_bytes()
    assert b"target.headers.X-Api-Key=<redacted>" in (out / "provenance.json").read_bytes()
    assert key not in proc.stdout + proc.stderr

    # a wrong key: one line naming the variable to set, and neither key in it
    wrong = f"sk-{secrets.token_hex(16)}"
    path.write_text(path.read_text().replace("api_key_env: LOADGEN_TEST_KEY\nworkload",
                                             "api_key_env: LOADGEN_OTHER_KEY\nworkload"))
    proc = run(path, tmp_path / "wrong", {"LOADGEN_TEST_KEY": key, "LOADGEN_OTHER_KEY": wrong})
    assert proc.returncode == 3, proc.stderr
    assert "HTTP 401" in proc.stderr
    assert "set the API key in the variable target.api_key_env names" in proc.stderr
    assert key not in proc.stderr
    assert wrong not in proc.stderr
    assert wrong.encode() not in everything_written(tmp_path / "wrong")


def test_secrets_given_every_way_are_written_nowhere(start_sim: object, tmp_path: Path) -> None:
    base_url = start_sim()  # type: ignore[operator]
    s = [f"s{i}-{secrets.token_hex(12)}" for i in range(5)]
    user_url = base_url.replace("http://", f"http://user:{s[0]}@")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "secrets-everywhere",
        "target": {"headers": {"X-Custom": s[1]}},
        "workload": {"num_prompts": 2, "input_tokens": 8, "output_tokens": 4},
        "matrix": {"target.headers.Authorization": [f"Bearer {s[2]}"]},
    }))
    out = tmp_path / "run"
    proc = run(path, out, {}, "--base-url", user_url, f"--set=target.headers.X-Trace={s[3]}",
               "--set", f"target.headers.X-Other={s[4]}")
    assert proc.returncode == 0, proc.stderr
    written = everything_written(out)
    for secret in s:
        assert secret.encode() not in written, secret
        assert secret not in proc.stdout + proc.stderr
    # the server measured is on record, without its password
    assert b"<redacted>@127.0.0.1" in (out / "scenario.resolved.yaml").read_bytes()
