"""The launcher with real child processes: readiness, crashes, busy ports, clean stops."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from loadgen.errors import LaunchError
from loadgen.servers import launch
from loadgen.servers.launch import LaunchedServer, LaunchSpec, free_port
from tests.conftest import live_group_members


def test_a_server_that_dies_before_ready_fails_at_once_with_its_log_tail(tmp_path: Path) -> None:
    code = "import sys; print('loading weights'); print('CUDA out of memory', flush=True); sys.exit(7)"
    spec = LaunchSpec((sys.executable, "-c", code), "127.0.0.1", free_port(), ready_timeout_s=60, name="engine")
    server = LaunchedServer(spec, tmp_path / "engine.log")
    with pytest.raises(LaunchError, match="engine exited with status 7 before it was ready") as exc:
        server.start()
    assert "CUDA out of memory" in exc.value.log_tail


def test_a_server_that_never_answers_misses_its_deadline_and_is_stopped(tmp_path: Path) -> None:
    spec = LaunchSpec((sys.executable, "-c", "import time; time.sleep(60)"), "127.0.0.1", free_port(),
                      ready_timeout_s=1.0, name="engine")
    server = LaunchedServer(spec, tmp_path / "engine.log", grace_s=2)
    with pytest.raises(LaunchError, match=r"not ready after 1 s \(waiting for /health"):
        server.start()
    assert server.proc is not None
    assert server.proc.poll() is not None  # stopped, not left behind
    assert live_group_members(server.proc.pid) == []


def test_missing_executable_and_busy_port_are_refused_before_launch(tmp_path: Path) -> None:
    spec = LaunchSpec(("no-such-engine-binary",), "127.0.0.1", free_port(), name="engine")
    with pytest.raises(LaunchError, match="cannot start 'no-such-engine-binary'"):
        LaunchedServer(spec, tmp_path / "a.log").start()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        spec = LaunchSpec((sys.executable, "-c", "pass"), "127.0.0.1", port, name="engine")
        with pytest.raises(LaunchError, match=f"port {port} on 127.0.0.1 is already in use"):
            LaunchedServer(spec, tmp_path / "b.log").start()


def test_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    # the leader ignores SIGTERM and its child would outlive it: both must go
    code = (
        "import signal, subprocess, sys, time, http.server, threading\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.send_header('content-length', '11'); self.end_headers()\n"
        "        self.wfile.write(b'{\"data\":[]}')\n"
        "    def log_message(self, *a): pass\n"
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n"
    )
    port = free_port()
    spec = LaunchSpec((sys.executable, "-c", code, str(port)), "127.0.0.1", port, ready_timeout_s=30)
    server = LaunchedServer(spec, tmp_path / "s.log", grace_s=1)
    assert server.start() == f"http://127.0.0.1:{port}/v1"
    assert server.proc is not None
    pgid = server.proc.pid
    assert len(live_group_members(pgid)) == 2  # the leader and its child
    server.stop()
    assert live_group_members(pgid) == []


# an engine's habit with a key: /health open to all, /v1/models only with "Authorization: Bearer KEY"
KEYED = (
    "import http.server, sys\n"
    "port, key = int(sys.argv[1]), sys.argv[sys.argv.index('--api-key') + 1]\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        ok = self.path == '/health' or self.headers.get('Authorization') == 'Bearer ' + key\n"
    "        self.send_response(200 if ok else 401); self.send_header('content-length', '11'); self.end_headers()\n"
    "        self.wfile.write(b'{\"data\":[]}')\n"
    "    def log_message(self, *a): pass\n"
    "http.server.HTTPServer(('127.0.0.1', port), H).serve_forever()\n"
)


def test_an_engine_started_with_an_api_key_is_asked_with_it_and_one_wanting_another_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(launch, "EVERY_S", 0.5)  # the progress line every half second, not every 5 s
    port = free_port()
    spec = LaunchSpec((sys.executable, "-c", KEYED, str(port), "--api-key", "sk-test"), "127.0.0.1", port,
                      ready_timeout_s=30, name="engine")
    server = LaunchedServer(spec, tmp_path / "keyed.log")
    try:
        assert server.start() == f"http://127.0.0.1:{port}/v1"
    finally:
        server.stop()
    # a key the command line does not hold (vLLM's VLLM_API_KEY): said while waiting, and at the end
    port = free_port()
    argv = (sys.executable, "-c", KEYED.replace("sys.argv.index('--api-key') + 1", "2"), str(port), "sk-env")
    said: list[str] = []
    server = LaunchedServer(LaunchSpec(argv, "127.0.0.1", port, ready_timeout_s=2.5, name="engine"),
                            tmp_path / "other.log", grace_s=2, on_wait=said.append)
    with pytest.raises(LaunchError, match=r"waiting for /v1/models; /v1/models answers HTTP 401: the server wants an "
                                          r"API key not on its command line \(one from its environment\?\); give it "
                                          r"as --api-key; log: "):
        server.start()
    assert any("/v1/models answers HTTP 401" in line for line in said), said
