"""The calls beside the load (the model list, ``/metrics``, a cache reset): each bounded in
time and in size, so that a server that accepts and never answers, or answers a byte a second,
or sends a page without end, holds no phase of a run."""

from __future__ import annotations

import asyncio

import httpx

SIDE_CALL_S = 30.0  # the most one side call may take, connecting included
SIDE_CONNECT_S = 10.0
PAGE_MAX_BYTES = 8 << 20  # a model list or a metrics page larger than this is refused


class SideCallError(ValueError):
    """A side call that timed out or answered too much; the message says which, in words."""


async def side_call(
    http: httpx.AsyncClient, method: str, url: str, *, what: str, headers: dict[str, str] | None = None,
    total_s: float = SIDE_CALL_S, max_bytes: int = PAGE_MAX_BYTES,
) -> tuple[int, bytes]:
    """``method url``'s status and body, read within ``total_s`` and ``max_bytes``; raises
    ``httpx.HTTPError`` as httpx does, and ``SideCallError`` naming ``what`` past either bound."""
    try:
        async with asyncio.timeout(total_s), http.stream(method, url, headers=headers) as resp:
            body = bytearray()
            async for chunk in resp.aiter_raw():
                body += chunk
                if len(body) > max_bytes:
                    raise SideCallError(f"{what}: the answer is over {max_bytes >> 20} MiB")
            return resp.status_code, bytes(body)
    except TimeoutError:
        raise SideCallError(f"{what}: no full answer within {total_s:g} s") from None


def side_client(*, verify: bool = True) -> httpx.AsyncClient:
    """An HTTP client for side calls: no proxy from the environment, no redirects followed;
    ``verify=False`` takes an https server's self-signed certificate."""
    return httpx.AsyncClient(trust_env=False, verify=verify, timeout=httpx.Timeout(SIDE_CALL_S, connect=SIDE_CONNECT_S))
