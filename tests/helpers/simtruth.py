"""The simulator's own account of its timing, read from its /metrics: the allowance a timing
check gives a busy machine."""

from __future__ import annotations

import httpx


def sim_metrics(base_url: str) -> dict[str, float]:
    """Every sample of the simulator's /metrics, by name (labels and all)."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", trust_env=False).text
    return {k: float(v) for k, v in (line.split() for line in text.splitlines() if line and line[0] != "#")}


def mean_lateness(sim: dict[str, float]) -> float:
    """The simulator's own lateness (its chunks' mean, s) from its /metrics: how far a busy
    machine put it off its schedule, the allowance of the timing checks."""
    return sim["loadgen_sim_chunk_lateness_seconds_sum"] / sim["loadgen_sim_chunk_lateness_seconds_count"]


def sim_requests(base_url: str) -> int:
    """The requests the simulator has been sent, by its own count."""
    return int(sim_metrics(base_url)["loadgen_sim_requests_total"])
