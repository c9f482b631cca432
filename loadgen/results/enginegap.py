"""The client against the engine: each latency as loadgen measured it next to the engine's own
figure for the same requests (the increase of its histograms over the cell, in its /metrics).
The difference is what the engine's HTTP server, the network and the client add: a millisecond or
a few on loopback (vLLM's TTFT starts when the request reaches its engine, after the HTTP server
has parsed and tokenized it). A client that reads much more than the engine (over a tenth, and
over 5 ms) is suspect, and the cell says so."""

from __future__ import annotations

from loadgen.results.figures import Distribution
from loadgen.results.samples import ServerMetrics
from loadgen.results.summary import CellMetrics, EngineGap

# a client reading this share above the engine's own figure, and this many ms, is worth a warning
# (below the floor, the gap is the HTTP server's own work on a short TTFT, not the client's)
GAP_SHARE_WARN = 0.10
GAP_MS_WARN = 5.0
# loadgen's figure and the engine's histogram of the same name
METRICS = (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("itl", "itl_s"), ("e2e", "e2e_s"))


def engine_gaps(metrics: CellMetrics | None, server: ServerMetrics | None) -> tuple[EngineGap, ...]:
    """The gap per metric the engine exports a histogram of (none without figures on both sides)."""
    if metrics is None or server is None:
        return ()
    out = []
    for name, key in METRICS:
        engine = server.histograms.get(key)
        client: Distribution = getattr(metrics, key)
        if engine is None or not engine.count or client.mean is None:
            continue
        client_ms, engine_ms = client.mean * 1e3, engine.mean * 1e3
        gap = client_ms - engine_ms
        out.append(EngineGap(
            name, client_ms, engine_ms, gap, gap / engine_ms if engine_ms > 0 else None,
            metrics.completed, int(engine.count),
        ))
    return tuple(out)


# what holds an answer's first bytes back inside the engine, after its own first token
TOOL_PARSER = ("the engine's tool-call parser holds an answer's first bytes until it has read the function's "
               "name, and the engine's own TTFT stops at its first token: the gap is the parser's wait, not the "
               "network's or the client's")


def gap_warnings(gaps: tuple[EngineGap, ...], completed: int, tool_calls: int = 0) -> list[str]:
    """A warning per metric the client reads over a tenth and 5 ms above the engine, where both
    counted the same requests (the engine's E2E count is its requests). Where answers called
    tools (``tool_calls``), a TTFT gap is the tool-call parser's: said so, not blamed on the
    network or the client."""
    same = any(g.metric == "e2e" and g.engine_count == completed for g in gaps)
    out = []
    for g in gaps:
        if not (same and g.gap_share is not None and g.gap_share > GAP_SHARE_WARN and g.gap_ms > GAP_MS_WARN):
            continue
        cause = (TOOL_PARSER if g.metric == "ttft" and tool_calls else
                 "the network or the client adds that much; see the self-check (client) figures")
        out.append(f"the client reads {g.metric.upper()} {g.gap_share:.0%} above the engine's own figure "
                   f"({g.client_ms:.2f} ms against {g.engine_ms:.2f} ms): {cause}")
    return out
