"""Every request is bounded by default: its headers have a deadline, comments alone do not keep
a stream alive once tokens flowed, and a stream past max_tokens is ended (``overrun``)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen.load.run import execute
from loadgen.results.records import read_records
from loadgen.results.rundir import rebuild_summary
from loadgen.scenario.loader import parse_scenario
from loadgen.scenario.target import default_total_s
from tests.conftest import StartSim
from tests.helpers.rawserver import MODELS_ANSWER, RawServer, is_models

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


def test_each_cell_records_the_bounds_its_requests_had(start_sim: StartSim, tmp_path: Path) -> None:
    url = start_sim(ttft_ms=1, itl_ms=1)
    sc = parse_scenario({
        "name": "bounds", "target": {"base_url": url},
        "workload": {"num_prompts": 2, "input_tokens": 8, "output_tokens": [16, 300], "prompt": "token-ids"},
        "matrix": {"target.timeouts.total_s": [None, 45]},
    }, "test")
    execute(sc, tmp_path / "run")
    summary = rebuild_summary(tmp_path / "run")
    bounds = {(c.params["output_tokens"], c.params["target.timeouts.total_s"]): c.request_bounds
              for c in summary.cells}
    # by hand: 600 s + 1 s per token; past max_tokens plus a tenth, at least 16, is an overrun
    default_16, default_300, set_16 = bounds[16, None], bounds[300, None], bounds[16, 45]
    assert default_16 is not None
    assert default_300 is not None
    assert set_16 is not None
    assert (default_16.total_s, default_16.overrun_after_tokens) == (616.0, 32)
    assert (default_300.total_s, default_300.overrun_after_tokens) == (900.0, 330)
    assert default_16.total_rule == "600 s + 1 s per token asked"
    assert (set_16.total_s, set_16.total_rule) == (45.0, "target.timeouts.total_s")
    assert (default_16.connect_s, default_16.first_token_s, default_16.idle_s) == (10.0, None, 120.0)
