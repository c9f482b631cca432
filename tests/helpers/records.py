"""Request records made by hand, as a measured run would write them."""

from __future__ import annotations

from loadgen.results.records import RequestRecord


def rec(i: int, sent: float, offsets: tuple[float, ...], tokens: tuple[int, ...], done: float, **kw: object) -> RequestRecord:
    out = sum(tokens)
    fields: dict[str, object] = dict(
        request_id=i, cell=0, warmup=False, scheduled_at=sent, sent_at=sent,
        first_token_at=sent + offsets[0] if offsets else None,
        last_token_at=sent + offsets[-1] if offsets else None, done_at=done,
        input_tokens=10, max_tokens=out, prompt_tokens=10, output_tokens=out,
        token_count_source="usage", chunk_tokens_total=out,
        chunk_offsets_s=offsets, chunk_tokens=tokens,
    )
    fields.update(kw)
    return RequestRecord(**fields)  # type: ignore[arg-type]


def steady_rec(ttft_ms: float, tpot_ms: float = 10.0, tokens: int = 11, ok: bool = True, i: int = 0) -> RequestRecord:
    """A request sent at 0 whose tokens came at TTFT, then every TPOT (the chunks' times say so)."""
    first = ttft_ms / 1e3
    last = first + (tokens - 1) * tpot_ms / 1e3
    return RequestRecord(
        cell=0, request_id=i, warmup=False, scheduled_at=0.0, sent_at=0.0,
        first_token_at=first if ok else None, last_token_at=last if ok else None, done_at=last if ok else 0.5,
        input_tokens=8, max_tokens=tokens, prompt_tokens=8, output_tokens=tokens if ok else 0,
        token_count_source="usage", chunk_tokens_total=tokens if ok else 0,
        chunk_offsets_s=tuple(first + k * tpot_ms / 1e3 for k in range(tokens)) if ok else (),
        chunk_tokens=(1,) * tokens if ok else (), status=200 if ok else 503, error=None if ok else "http_503",
    )
