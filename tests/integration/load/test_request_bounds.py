"""Every request is bounded by default: its headers have a deadline, comments alone do not keep
a stream alive once tokens flowed, and a stream past max_tokens is ended (``overrun``)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen.load.run import execute
from loadgen.load.stream import default_total_s
from loadgen.results.records import read_records
from loadgen.scenario.loader import parse_scenario
from tests.rawserver import MODELS_ANSWER, RawServer, is_models

TOKEN = b'data: {"choices": [{"index": 0, "text": " a", "finish_reason": null}]}\n\n'


class Misbehaving(RawServer):
    """``drip_headers``: the status line a byte every 0.3 s; ``token_then_comments``: one token,
    then an SSE comment every 0.2 s without end."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        while not self.closing.is_set():
            head = conn.recv(65536)
            if not head:
                return
            if is_models(head):
                conn.sendall(MODELS_ANSWER)
                continue
            if self.mode == "drip_headers":
                for byte in b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n":
                    if self.closing.wait(0.3):
                        return
                    conn.sendall(bytes([byte]))
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            conn.sendall(b"%x\r\n%s\r\n" % (len(TOKEN), TOKEN))
            comment = b": keep-alive\n\n"
            while not self.closing.wait(0.2):
                conn.sendall(b"%x\r\n%s\r\n" % (len(comment), comment))


@pytest.fixture
def misbehaving() -> Iterator[list[Misbehaving]]:
    made: list[Misbehaving] = []
    yield made
    for m in made:
        m.close()


@pytest.mark.parametrize(("mode", "detail"), [
    ("drip_headers", "response headers not complete in 1.0 s"),
    ("token_then_comments", "no token for 1.0 s"),
])
def test_a_request_that_would_never_end_is_ended(
    misbehaving: list[Misbehaving], tmp_path: Path, mode: str, detail: str,
) -> None:
    server = Misbehaving(mode)
    misbehaving.append(server)
    sc = parse_scenario({
        "name": "bounds",
        "target": {"base_url": f"http://127.0.0.1:{server.port}/v1", "model": "m",
                   "timeouts": {"between_tokens_s": 1.0}},
        "workload": {"num_prompts": 2, "input_tokens": 8, "output_tokens": 4, "prompt": "random-tokens"},
        "load": {"concurrency": [2], "warmup_requests": 0},
    }, "bounds")
    t = time.monotonic()
    execute(sc, tmp_path / "run")
    assert time.monotonic() - t < 8
    records = list(read_records(tmp_path / "run" / "records.jsonl"))
    assert len(records) == 2
    assert {r.error for r in records} == {"timeout"}
    assert all(detail in (r.error_detail or "") for r in records)


def test_the_default_total_bound_follows_max_tokens() -> None:
    # generous: ten minutes and a second per token asked for
    assert default_total_s(16) == 616.0
    assert default_total_s(2048) == 2648.0
