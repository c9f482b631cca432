"""The dispatcher runs any slice of a schedule: what worker processes will each be given."""

from __future__ import annotations

import asyncio
import time

from loadgen.load.client import ClientConfig, PreparedRequest, StreamingClient
from loadgen.load.dispatch import LoadPlan, run_load
from loadgen.load.schedule import concurrency_shares, iter_offsets
from loadgen.results.records import RequestRecord
from loadgen.scenario.target import Sampling, Target
from loadgen.workload.payload import Prompt, build_payload, encode_payload
from tests.conftest import StartSim


def test_slices_of_a_schedule_add_up_to_the_whole(start_sim: StartSim) -> None:
    base_url = start_sim(ttft_ms=5, itl_ms=1)
    body = encode_payload(build_payload("completions", "loadgen-sim", Prompt(4, token_ids=(1, 2, 3, 4)), 3,
                                        sampling=Sampling()))
    pool = [PreparedRequest(0, body, 4, 3)] * 10  # request i of the schedule is pool[i]

    async def run_slices() -> list[list[RequestRecord]]:
        target = Target(base_url=base_url)
        out: list[list[RequestRecord]] = []
        start = time.perf_counter_ns()
        async with StreamingClient(ClientConfig(target, base_url, start)) as client:
            for k, conc in enumerate(concurrency_shares(3, 6)):  # worker k of 3 sends k, k + 3, ...
                indices = range(k, 10, 3)
                records: list[RequestRecord] = []
                plan = LoadPlan(pool, iter_offsets(50.0, arrival="constant"), 10, conc)
                await run_load(client, plan, start_ns=start, emit=records.append, stop=asyncio.Event(),
                               indices=iter(indices))
                out.append(records)
        return out

    slices = asyncio.run(run_slices())
    assert [sorted(r.request_id for r in s) for s in slices] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    # each request keeps its place on the shared schedule: offset i / 50 s from the same start
    for s in slices:
        for r in s:
            assert abs(r.scheduled_at - r.request_id / 50) < 1e-6
            assert r.ok
            assert r.output_tokens == 3
