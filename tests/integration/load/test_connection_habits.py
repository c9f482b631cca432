"""Connections as real servers treat them: a server that closes the connection after every
streamed answer while its headers offer keep-alive (llama.cpp's habit) loses no request. The
client sends a request again, once, on a new connection when a kept-alive one was closed before
any byte of the answer, counts it, and learns the habit: from then on every request opens its own
connection, said once on the console and in provenance."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from loadgen.load.run import execute
from loadgen.results.records import read_records
from loadgen.scenario.loader import parse_scenario
from tests.helpers.rawserver import MODELS, RawServer, is_models

ROOT = Path(__file__).parents[3]
TOKENS = 12
GAP_S = 0.002


class ClosesAfterEachAnswer(RawServer):
    """Streams 12 tokens 2 ms apart, says ``Connection: keep-alive`` and then closes; counts
    the connections it accepted and the requests it answered."""

    interim = b""  # sent before the answer's own head

    def __init__(self) -> None:
        self.connections = 0
        self.answered = 0
        self.lock = threading.Lock()
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        with self.lock:
            self.connections += 1
        head = conn.recv(65536)
        if not head:
            return
        keep = b"Connection: keep-alive\r\nKeep-Alive: timeout=5, max=100\r\n"
        if is_models(head):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + keep
                         + b"Content-Length: %d\r\n\r\n%s" % (len(MODELS), MODELS))
            return  # and close, as the server does after every answer
        if not head.startswith(b"POST "):  # /metrics and the like: not this server's
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            return
        while b"\r\n\r\n" in head and len(head.split(b"\r\n\r\n", 1)[1]) < _length(head):
            head += conn.recv(65536)
        conn.sendall(self.interim + b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + keep
                     + b"Transfer-Encoding: chunked\r\n\r\n")
        for i in range(TOKENS):
            time.sleep(GAP_S)
            last = i == TOKENS - 1
            finish = '"length"' if last else "null"
            usage = f', "usage": {{"prompt_tokens": 8, "completion_tokens": {TOKENS}}}' if last else ""
            event = f'data: {{"choices": [{{"index": 0, "text": " t", "finish_reason": {finish}}}]{usage}}}\n\n'.encode()
            conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
        done = b"data: [DONE]\n\n"
        conn.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        with self.lock:
            self.answered += 1


class SendsEarlyHints(ClosesAfterEachAnswer):
    """The same answers, each after an interim ``103 Early Hints`` (as a CDN in front may send)."""

    interim = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\n\r\n"


def _length(head: bytes) -> int:
    for line in head.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


SCENARIO = {
    "name": "closes",
    "target": {"model": "m"},
    "workload": {"num_prompts": 150, "input_tokens": 8, "output_tokens": TOKENS, "prompt": "token-ids"},
    "load": {"concurrency": [4, 8], "warmup_requests": 1},
}


def test_a_server_that_closes_after_each_answer_loses_no_request(tmp_path: Path) -> None:
    server = ClosesAfterEachAnswer()
    try:
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump(SCENARIO))
        proc = subprocess.run(
            [sys.executable, "-m", "loadgen", "run", str(path), "--base-url", server.base_url,
             "--out", str(tmp_path / "run")],
            cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        )
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr
    records = list(read_records(tmp_path / "run" / "records.jsonl"))
    measured = [r for r in records if not r.warmup]
    assert len(measured) == 300
    assert [r for r in records if r.error is not None] == []  # not one request lost to the habit
    assert {r.output_tokens for r in measured} == {TOKENS}
    # the habit is learned once, said once, and on record
    assert proc.stderr.count("the server closes its connections after each answer") == 1
    provenance = json.loads((tmp_path / "run" / "provenance.json").read_text())
    assert provenance["connections"]["reuse"] is False
    # every request the server answered came on a connection of its own
    assert server.answered == len(records)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    retries = sum(c["metrics"]["connection_retries"] for c in summary["cells"])
    assert retries == sum(r.retries for r in measured)
    for cell in summary["cells"]:
        retried = cell["metrics"]["connection_retries"]
        assert any("sent again on a new connection" in w for w in cell["warnings"]) == (retried > 0)


class DropsAReusedConnection(RawServer):
    """Keeps connections alive, but closes each one, unanswered, when its second request comes:
    the race of a server whose close is still in flight when the client reuses the connection."""

    def __init__(self) -> None:
        self.dropped = 0
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        served = 0
        while not self.closing.is_set():
            head = conn.recv(65536)
            if not head:
                return
            if is_models(head):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(MODELS), MODELS))
                continue
            if served == 1:
                self.dropped += 1
                return  # closed without a byte of answer
            served += 1
            event = (b'data: {"choices": [{"index": 0, "text": " t", "finish_reason": "length"}], '
                     b'"usage": {"prompt_tokens": 8, "completion_tokens": 1}}\n\ndata: [DONE]\n\n')
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(event), event))


def test_a_request_on_a_connection_closed_unanswered_is_sent_again_once(tmp_path: Path) -> None:
    from loadgen.scenario.loader import parse_scenario

    server = DropsAReusedConnection()
    try:
        sc = parse_scenario({
            "name": "drops", "target": {"base_url": server.base_url, "model": "m"},
            "workload": {"num_prompts": 6, "input_tokens": 8, "output_tokens": 1, "prompt": "token-ids"},
            "load": {"concurrency": 1, "warmup_requests": 0},
        }, "drops")
        execute(sc, tmp_path / "run")
    finally:
        server.close()
    records = list(read_records(tmp_path / "run" / "records.jsonl"))
    assert [r.error for r in records] == [None] * 6
    # the connection opened before the window answers the first request and drops the second,
    # which is sent again on a new connection; the habit is then learned (each request opens its
    # own connection, and its first request is answered): one drop, one retry
    assert sum(r.retries for r in records) == server.dropped == 1
    assert all(r.retries <= 1 for r in records)


@pytest.mark.locust
def test_locust_users_lose_no_request_to_the_habit_either(tmp_path: Path) -> None:
    server = ClosesAfterEachAnswer()
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**SCENARIO, "load": {}}))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "loadgen", "locust", "--scenario", str(path), "--host", server.base_url,
             "--headless", "-u", "4", "-r", "4", "-t", "4s", "--out", str(tmp_path / "run"), "--only-summary"],
            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        )
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [r for r in read_records(tmp_path / "run" / "records.jsonl") if r.error != "cancelled"]
    assert len(records) > 50
    assert [r for r in records if r.error is not None] == []
    assert "every request from here on opens a new connection" in proc.stderr


def test_the_locust_client_notices_a_close_that_came_before_its_next_request() -> None:
    # the server's close arrived before the next request: the client's pool quietly opens a new
    # connection (nothing is sent again), and the close right after the answer is still counted,
    # so the Locust user learns the habit on a busy machine too (before, only a request sent again
    # taught it, and a CI run whose every close came first never said it)
    from geventhttpclient.url import URL

    from loadgen.locust.transport import closed_after_answer, open_client
    from loadgen.scenario.target import Timeouts

    server = ClosesAfterEachAnswer()
    try:
        http = open_client(URL(server.base_url + "/models"), Timeouts())
        for _ in range(3):
            assert b"data" in http.get("/v1/models").read()
            time.sleep(0.2)  # the close has come before the next request
        closes = closed_after_answer(http)
        http.close()
    finally:
        server.close()
    assert closes == 2  # the second and third requests each found the last one's connection closed


def test_an_interim_answer_before_each_stream_is_passed_over(tmp_path: Path) -> None:
    """``103 Early Hints`` before each answer: every request is measured on the answer after it
    (each failed as "HTTP 103 where a stream was expected")."""
    server = SendsEarlyHints()
    try:
        execute(parse_scenario({**SCENARIO, "target": {"model": "m", "base_url": server.base_url},
                                "workload": {**SCENARIO["workload"], "num_prompts": 12}, "load": {"concurrency": 2}}),
                tmp_path / "run")
    finally:
        server.close()
    records = [r for r in read_records(tmp_path / "run" / "records.jsonl") if not r.warmup]
    assert len(records) == 12
    assert [r.error for r in records] == [None] * 12
    assert {(r.output_tokens, len(r.chunk_offsets_s)) for r in records} == {(TOKENS, TOKENS)}
