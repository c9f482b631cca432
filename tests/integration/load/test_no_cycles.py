"""A finished request leaves nothing for the cyclic garbage collector: its state is freed the
moment it is done. Left in reference cycles (a deadline timer that re-arms itself, a connection
and its parser, a transport and its protocol), every request's parser, token times and timers
would wait for a collection, and a collection over that much young garbage stalls the event
loop for tens of milliseconds at high concurrency: a stall that lands in every stream's ITL.

Counted with the collector off: what ``gc.collect`` finds unreachable after a run of requests,
on both event loops and both clocks, against a server that keeps its connections alive and one
that closes each after its answer (a new connection per request)."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest
import uvloop

from loadgen.load.client import ClientConfig, PreparedRequest, StreamingClient
from loadgen.load.dispatch import LoadPlan, run_load
from loadgen.load.schedule import iter_offsets
from loadgen.results.records import RequestRecord
from loadgen.scenario.target import Sampling, Target, Timeouts
from loadgen.workload.payload import Prompt, build_payload, encode_payload
from tests.conftest import StartSim
from tests.integration.load.test_connection_habits import ClosesAfterEachAnswer

REQUESTS = 60


def garbage_of_a_run(base_url: str, clock: str, loop_kind: str) -> tuple[list[object], list[RequestRecord]]:
    """The objects the collector finds unreachable after ``REQUESTS`` requests (a first run of a
    few requests, collected, sets up what a client keeps: connections, the poller)."""
    body = encode_payload(build_payload("completions", "loadgen-sim", Prompt(4, token_ids=(1, 2, 3, 4)), 12,
                                        sampling=Sampling()))

    async def main() -> list[RequestRecord]:
        start = time.perf_counter_ns()
        records: list[RequestRecord] = []
        # deadlines on every request: their timers are part of what must be freed
        timeouts = Timeouts(first_token_s=30, between_tokens_s=30, total_s=60)
        config = ClientConfig(Target(base_url=base_url, model="loadgen-sim", timeouts=timeouts), base_url, start, clock=clock)
        async with StreamingClient(config) as client:
            for n in (4, REQUESTS):
                pool = [PreparedRequest(0, body, 4, 12)] * n
                plan = LoadPlan(pool, iter_offsets(None), n, 4)
                if n == REQUESTS:
                    gc.collect()
                    gc.disable()
                await run_load(client, plan, start_ns=start, emit=records.append, stop=asyncio.Event())
                await asyncio.sleep(0.05)  # the closed connections' losses handed over
            gc.set_debug(gc.DEBUG_SAVEALL)  # what it finds is kept in gc.garbage, to be named
            gc.collect()
        return records

    try:
        records = uvloop.run(main()) if loop_kind == "uvloop" else asyncio.run(main())
        garbage = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    return garbage, records


@pytest.mark.parametrize("loop_kind", ["uvloop", "asyncio"])
@pytest.mark.parametrize("clock", ["kernel", "loop"])
@pytest.mark.parametrize("server", ["keeps-alive", "closes"])
def test_a_finished_request_leaves_no_garbage_cycle(start_sim: StartSim, server: str, clock: str,
                                                     loop_kind: str) -> None:
    closing = ClosesAfterEachAnswer() if server == "closes" else None
    try:
        base_url = closing.base_url if closing is not None else start_sim(ttft_ms=2, itl_ms=1)
        garbage, records = garbage_of_a_run(base_url, clock, loop_kind)
    finally:
        if closing is not None:
            closing.close()
    assert len(records) == 4 + REQUESTS
    assert all(r.ok for r in records), [r.error_detail for r in records if not r.ok]
    assert all(r.output_tokens == 12 for r in records)
    # none of loadgen's objects (before: a request's state, parser, timers and closures, about 28
    # objects per request, and a connection and its parser per connection closed)
    ours = [type(o).__qualname__ for o in garbage if type(o).__module__.startswith("loadgen")]
    assert ours == []
    kinds = {type(o).__qualname__ for o in garbage}
    if loop_kind == "asyncio" and server == "closes":
        # Python's own socket transport keeps a method of its own (a cycle), 7 objects a connection
        assert kinds <= {"_SelectorSocketTransport", "TransportSocket", "socket", "dict", "method", "tuple"}
    else:  # what is left is the run's own few (the plan's iterators, the loop's bookkeeping)
        assert len(garbage) < REQUESTS // 2, sorted(kinds)
