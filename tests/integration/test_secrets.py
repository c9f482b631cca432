"""The API key is read from the variable the scenario names and is written nowhere: not in
the run directory, the server log, provenance, or an error message. Credential headers given
in a scenario or with --set are redacted where the run writes them."""

from __future__ import annotations

import base64
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from loadgen.cli import app
from loadgen.scenario.loader import parse_scenario
from loadgen.scenario.redact import dump_scenario
from loadgen.servers.launch import free_port
from tests.conftest import StartSim
from tests.helpers.rawserver import MODELS_ANSWER, RawServer, is_models

ROOT = Path(__file__).parents[2]


def run(path: Path, out: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadgen", "run", str(path), "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, **env},
                          check=False)


def everything_written(run_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file())


def keyed_scenario(tmp_path: Path, name: str, prompts: int, output: int) -> Path:
    """A scenario whose simulator demands the key in LOADGEN_TEST_KEY, and whose client sends it."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": name,
        "serve": {"backend": "sim", "sim": {"ttft_ms": 5, "itl_ms": 1, "api_key_env": "LOADGEN_TEST_KEY"}},
        "target": {"api_key_env": "LOADGEN_TEST_KEY"},
        "workload": {"num_prompts": prompts, "input_tokens": 8, "output_tokens": output},
    }))
    return path


def test_the_api_key_is_used_and_never_written(tmp_path: Path) -> None:
    key, header_secret = f"sk-{secrets.token_hex(16)}", f"hdr-{secrets.token_hex(16)}"
    path = keyed_scenario(tmp_path, "secrets", 6, 4)
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
    # and the reports made from the run directory show none of them either
    report = loadgen("report", str(out), "--html", "--format", "md")
    assert report.returncode == 0, report.stderr
    assert (out / "report.html").stat().st_size > 0
    for secret in s:
        assert secret.encode() not in everything_written(out), secret
        assert secret not in report.stdout + report.stderr


def loadgen(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, timeout=180,
                          cwd=ROOT, env={**os.environ, **(env or {})}, check=False)


def all_text(*paths: Path) -> bytes:
    out = b""
    for p in paths:
        if p.is_dir():
            out += everything_written(p)
        elif p.is_file():
            out += p.read_bytes()
    return out


def test_a_key_with_the_line_break_echo_leaves_is_sent_without_it_and_shown_nowhere(tmp_path: Path) -> None:
    key = f"sk-{secrets.token_hex(16)}"
    path = keyed_scenario(tmp_path, "newline", 3, 2)
    proc = run(path, tmp_path / "run", {"LOADGEN_TEST_KEY": key + "\n"})
    assert proc.returncode == 0, proc.stderr
    assert "completed 3/3" in proc.stdout  # the simulator took the key: the line break was not sent
    assert key.encode() not in everything_written(tmp_path / "run")
    assert key not in proc.stdout + proc.stderr
    # a line break inside the key: refused in one line that names the variable, not the key
    proc = run(path, tmp_path / "inside", {"LOADGEN_TEST_KEY": key[:10] + "\n" + key[10:]})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: LOADGEN_TEST_KEY: the API key in this variable holds a line break or control character; "
        "set it to the key alone")
    assert key[10:] not in proc.stderr


@pytest.mark.parametrize("url", [
    "http://user:{pw}@[::1", "http://user:{pw}@host:99999/v1", "ftp://user:{pw}@host/v1", "http://user:{pw}@",
    "user:{pw}@host", "http://user:{pw}@host /v1",
])
def test_a_malformed_base_url_is_one_line_without_its_password(tmp_path: Path, url: str) -> None:
    pw = secrets.token_hex(8)
    proc = loadgen("run", "--base-url", url.format(pw=pw), "--num-prompts", "2", "--out", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert pw not in proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --base-url ")
    assert not (tmp_path / "run").exists()


def test_a_server_that_cannot_list_models_is_named_without_the_urls_password(tmp_path: Path) -> None:
    """Nothing listening, and a server that answers the model list with something else: the line
    names the address, its user and password left out."""
    pw = secrets.token_hex(8)
    down = free_port("127.0.0.1")
    other = ListsNoModels()
    try:
        for port, says in ((down, "/models: cannot list models ("), (other.port, "/models: cannot list models (not an OpenAI /models answer)")):
            result = CliRunner().invoke(app, ["run", "--base-url", f"http://alice:{pw}@127.0.0.1:{port}/v1",
                                              "--num-prompts", "2", "--out", str(tmp_path / str(port))])
            assert result.exit_code == 3, result.output
            assert f"http://<redacted>@127.0.0.1:{port}/v1{says}" in " ".join(result.output.split())
            assert pw not in result.output
    finally:
        other.close()


class ListsNoModels(RawServer):
    def serve(self, conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n[]")


def test_a_header_value_with_a_line_break_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "crlf", "serve": {"backend": "sim"}, "workload": {"num_prompts": 2, "input_tokens": 8, "output_tokens": 2},
        "target": {"headers": {"X-Team": "a\r\nX-Injected: 1"}},
    }))
    proc = run(path, tmp_path / "run", {})
    assert proc.returncode == 2, proc.stderr
    assert "header X-Team: its value holds a line break or NUL; give the value alone" in proc.stderr
    assert "X-Injected" not in proc.stderr
    assert not (tmp_path / "run").exists()
    # a file saved with a header redacted is refused, not sent with the literal placeholder
    path.write_text(path.read_text().replace("a\\r\\nX-Injected: 1", "<redacted>"))
    proc = run(path, tmp_path / "run", {})
    assert proc.returncode == 2, proc.stderr
    assert "header X-Team: <redacted> stands where loadgen wrote down a secret" in proc.stderr


def test_bench_serve_headers_are_redacted_in_provenance(start_sim: StartSim, tmp_path: Path) -> None:
    url = start_sim(ttft_ms=2, itl_ms=1)
    secret = f"hdr-{secrets.token_hex(12)}"
    out = tmp_path / "bench"
    proc = loadgen("bench", "serve", "--base-url", url.removesuffix("/v1"), "--model", "loadgen-sim",
                   "--dataset-name", "random", "--random-input-len", "8", "--random-output-len", "2",
                   "--num-prompts", "3", "--header", f"Authorization=Bearer {secret}", "X-Team=blue",
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert secret.encode() not in all_text(out)
    assert secret not in proc.stdout + proc.stderr
    assert b"Authorization=<redacted>" in (out / "provenance.json").read_bytes()


@pytest.mark.locust
def test_locust_host_password_is_written_nowhere(start_sim: StartSim, tmp_path: Path) -> None:
    url = start_sim(ttft_ms=2, itl_ms=1)
    pw = secrets.token_hex(10)
    host = url.replace("http://", f"http://tester:{pw}@")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "lc", "workload": {"input_tokens": 8, "output_tokens": 2}}))
    proc = loadgen("locust", "--scenario", str(path), "--host", host, "--headless", "-u", "2", "-r", "2",
                   "-t", "3s", "--csv", str(tmp_path / "stats"), "--out", str(tmp_path / "run"), "--only-summary")
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = all_text(tmp_path / "run", *tmp_path.glob("stats*"))
    assert (tmp_path / "run" / "records.jsonl").stat().st_size > 0  # requests were sent and recorded
    assert pw.encode() not in written
    assert pw not in proc.stdout + proc.stderr


def test_a_saved_scenario_reads_its_headers_from_variables(
    start_sim: StartSim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = f"sk-{secrets.token_hex(12)}"
    monkeypatch.setenv("LOADGEN_SIM_KEY", key)
    url = start_sim(ttft_ms=2, itl_ms=1, api_key_env="LOADGEN_SIM_KEY")  # demands "Authorization: Bearer KEY"
    saved = tmp_path / "saved.yaml"
    proc = loadgen("bench", "serve", "--base-url", url.removesuffix("/v1"), "--model", "loadgen-sim",
                   "--dataset-name", "random", "--random-input-len", "8", "--random-output-len", "2",
                   "--num-prompts", "2", "--header", f"Authorization=Bearer {key}", "--save-scenario", str(saved),
                   "--out", str(tmp_path / "bench"), env={"OPENAI_API_KEY": ""})
    assert proc.returncode == 0, proc.stderr
    assert key not in saved.read_text()
    assert "Authorization: ${LOADGEN_HEADER_AUTHORIZATION}" in saved.read_text()
    assert "it reads its headers from LOADGEN_HEADER_AUTHORIZATION: set them first" in proc.stderr
    # without the variable: one line before anything starts
    proc = loadgen("run", str(saved), "--out", str(tmp_path / "without"), env={"OPENAI_API_KEY": ""})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: target.headers.Authorization: set the variable LOADGEN_HEADER_AUTHORIZATION (its value is the header's)")
    assert not (tmp_path / "without").exists()
    # with it: the server takes the header, and the run directory holds the reference, not the key
    proc = loadgen("run", str(saved), "--out", str(tmp_path / "with"),
                   env={"OPENAI_API_KEY": "", "LOADGEN_HEADER_AUTHORIZATION": f"Bearer {key}"})
    assert proc.returncode == 0, proc.stderr
    assert "completed 2/2" in proc.stdout
    assert key.encode() not in everything_written(tmp_path / "with")


class BasicAuthServer(RawServer):
    """Answers the model list and one-token streams, but only to ``Authorization: Basic`` of
    ``tester:<password>`` (401 otherwise); keeps every Authorization header it was sent."""

    def __init__(self, password: str) -> None:
        self.expected = b"Basic " + base64.b64encode(f"tester:{password}".encode())
        self.seen: list[bytes] = []
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        while not self.closing.is_set():
            head = conn.recv(65536)
            if not head:
                return
            auth = [line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                    if line.lower().startswith(b"authorization:")]
            self.seen += auth
            if auth != [self.expected]:
                conn.sendall(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
                continue
            if is_models(head):
                conn.sendall(MODELS_ANSWER)
                continue
            body = (b'data: {"choices": [{"index": 0, "text": " a", "finish_reason": "length"}], '
                    b'"usage": {"prompt_tokens": 8, "completion_tokens": 1}}\n\ndata: [DONE]\n\n')
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))


def test_a_password_in_the_base_url_is_sent_as_basic_auth_and_written_nowhere(tmp_path: Path) -> None:
    pw = secrets.token_hex(10)
    server = BasicAuthServer(pw)
    try:
        out = tmp_path / "run"
        proc = loadgen("run", "--base-url", f"http://tester:{pw}@127.0.0.1:{server.port}/v1", "--num-prompts", "3",
                       "--output-len", "1", "--set", "workload.prompt=token-ids", "--out", str(out),
                       env={"OPENAI_API_KEY": ""})
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr
    assert "completed 3/3" in proc.stdout
    assert set(server.seen) == {server.expected}  # every request carried it, the model lookup included
    assert pw.encode() not in everything_written(out)
    assert pw not in proc.stdout + proc.stderr


@pytest.mark.locust
def test_the_locust_web_ui_shows_no_password(start_sim: StartSim, tmp_path: Path) -> None:
    url = start_sim(ttft_ms=2, itl_ms=1)
    pw = secrets.token_hex(10)
    port = free_port("127.0.0.1")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "web", "workload": {"input_tokens": 8, "output_tokens": 2}}))
    run_dir = tmp_path / "run"
    with (tmp_path / "locust.log").open("w") as log:
        ui = subprocess.Popen(
            [sys.executable, "-m", "loadgen", "locust", "--scenario", str(path),
             "--host", url.replace("http://", f"http://tester:{pw}@"), "--web-port", str(port), "--out", str(run_dir)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )
    web = f"http://127.0.0.1:{port}"
    seen = b""
    try:
        with httpx.Client(timeout=10) as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    page = http.get(web + "/")
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, (tmp_path / "locust.log").read_text()
                    assert ui.poll() is None, (tmp_path / "locust.log").read_text()
                    time.sleep(0.2)
            seen += page.content
            # a test started from the page, with the host the page offers
            assert http.post(web + "/swarm", data={"user_count": 2, "spawn_rate": 2, "host": url}).status_code == 200
            time.sleep(3)
            for page_path in ("/", "/stats/requests", "/llm/stats", "/llm/history", "/llm/scenario", "/llm/stats/csv",
                              "/stats/requests/csv", "/stats/report"):
                seen += http.get(web + page_path).content
            seen += http.get(web + "/stop").content
            time.sleep(1)
            seen += http.get(web + "/").content
    finally:
        ui.terminate()
        ui.wait(30)
    log_text = (tmp_path / "locust.log").read_bytes()
    records = run_dir / "records.jsonl"
    assert records.stat().st_size > 0  # the users sent requests
    assert pw.encode() not in seen
    assert pw.encode() not in log_text
    assert pw.encode() not in everything_written(run_dir)
    assert b"tester" not in seen  # the user name, too, stays off the page


def test_an_engines_secret_flags_are_shown_and_written_redacted(tmp_path: Path) -> None:
    key, token = f"sk-{secrets.token_hex(12)}", f"hf_{secrets.token_hex(12)}"
    secret_args = ["--", "--api-key", key, f"--hf-token={token}"]
    script = loadgen("serve", "tiny", "--backend", "vllm", "--script", *secret_args)
    dry = loadgen("serve", "tiny", "--backend", "vllm", "--dry-run", *secret_args)
    for proc in (script, dry):
        assert proc.returncode == 0, proc.stderr
        assert key not in proc.stdout + proc.stderr
        assert token not in proc.stdout + proc.stderr
    assert "--api-key '<redacted>'" in dry.stdout
    # the script reads them from variables when it runs, and says which
    assert '--api-key "${LOADGEN_ENGINE_API_KEY:?' in script.stdout
    assert "# set LOADGEN_ENGINE_HF_TOKEN first (the engine's --hf-token)" in script.stdout
    assert subprocess.run(["bash", "-n", "-c", script.stdout], check=False).returncode == 0
    # a scenario's engine arguments are written down redacted too
    resolved = dump_scenario(parse_scenario(
        {"name": "x", "serve": {"backend": "vllm", "model": "tiny", "extra_args": ["--api-key", key, f"--hf-token={token}"]}},
        "test"))
    assert key not in resolved
    assert token not in resolved
    assert "--hf-token=<redacted>" in resolved

    # serve itself: the line it prints, while an engine that never gets ready is started
    engine = tmp_path / "engine"
    engine.write_text("#!/bin/sh\necho started\nexec sleep 600\n")
    engine.chmod(0o755)
    log = tmp_path / "engine.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadgen", "serve", "tiny", "--backend", "vllm", "--port", "0", "--log", str(log),
         *secret_args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "LOADGEN_VLLM_PYTHON": str(engine)},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (log.exists() and b"started" in log.read_bytes()):
        time.sleep(0.05)
    proc.terminate()
    out, err = proc.communicate(timeout=30)
    assert "starting: " in err
    assert key not in out + err
    assert token not in out + err
