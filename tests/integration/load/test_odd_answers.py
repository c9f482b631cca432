"""Answers a stream is not: 204 No Content, and a web page whose body looks like events."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen.load.run import execute
from loadgen.results.records import read_records
from loadgen.scenario.loader import parse_scenario

SSE_BODY = (b'data: {"choices":[{"text":" a","index":0,"finish_reason":"length"}]}\n\n'
            b'data: [DONE]\n\n')
ANSWERS = {
    "204": b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n",
    "html": (b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: "
             + str(len(SSE_BODY)).encode() + b"\r\nConnection: close\r\n\r\n" + SSE_BODY),
}


@pytest.fixture(params=sorted(ANSWERS))
def odd_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    answer = ANSWERS[request.param]

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            data = b""
            while b"\r\n\r\n" not in data:
                more = self.request.recv(65536)
                if not more:
                    return
                data += more
            head, _, body = data.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            while len(body) < length:
                body += self.request.recv(65536)
            self.request.sendall(answer)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield request.param, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_odd_answers_are_classed(odd_server: tuple[str, str], tmp_path: Path) -> None:
    kind, base_url = odd_server
    sc = parse_scenario({
        "target": {"base_url": base_url, "model": "m"},
        "workload": {"num_prompts": 3, "input_tokens": 8, "output_tokens": 1, "prompt": "token-ids"},
        "load": {"warmup_requests": 0},
    })
    execute(sc, tmp_path / "run")
    records = list(read_records(tmp_path / "run" / "records.jsonl"))
    assert len(records) == 3
    if kind == "204":
        assert {(r.error, r.error_detail) for r in records} == {("http_status", "HTTP 204 where a stream was expected")}
    else:
        assert {r.error for r in records} == {"malformed"}
        assert all("text/html" in (r.error_detail or "") for r in records)
