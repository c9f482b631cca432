"""The abort rule by hand: failures / finished measured requests, from the minimum count on."""

from __future__ import annotations

import asyncio

from loadgen.load.cell import AbortRule
from loadgen.results.records import RequestRecord
from loadgen.scenario.loader import parse_scenario


def rec(error: str | None, warmup: bool = False) -> RequestRecord:
    return RequestRecord(
        request_id=0, cell=0, warmup=warmup, scheduled_at=0.0, sent_at=0.0, first_token_at=None,
        last_token_at=None, done_at=0.1, input_tokens=1, max_tokens=1, prompt_tokens=None, output_tokens=0,
        token_count_source="chunks", chunk_tokens_total=0, error=error,  # type: ignore[arg-type]
    )


def test_abort_rule_counts_from_the_minimum_and_ignores_warmup_and_cancelled() -> None:
    stop = asyncio.Event()
    rule = AbortRule(parse_scenario({"load": {"abort_on_error_rate": 0.5, "abort_min_requests": 4}}), stop)
    for r in (rec("timeout", warmup=True), rec("cancelled"), rec("http_status"), rec(None), rec("reset")):
        rule.add(r)
    # 3 finished (2 failed): below the minimum of 4, although 67% failed
    assert not stop.is_set()
    rule.add(rec(None))  # 4 finished, 2 failed: 50% >= 50%
    assert stop.is_set()
    assert rule.reason == "2 of 4 requests failed (50% >= load.abort_on_error_rate 50%)"


def test_no_rule_no_abort() -> None:
    stop = asyncio.Event()
    rule = AbortRule(parse_scenario({}), stop)
    for _ in range(50):
        rule.add(rec("http_status"))
    assert not stop.is_set()
    assert rule.reason is None
