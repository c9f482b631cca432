"""ASGI plumbing of loadgen's servers: SSE framing, whole responses, request bodies, lifespan and
uvicorn."""

from __future__ import annotations

from typing import Any

ASGIScope = dict[str, Any]


def hung_up(send: Any) -> bool:
    """Whether the client closed the connection (uvicorn's request cycle knows)."""
    return bool(getattr(getattr(send, "__self__", None), "disconnected", False))


async def send_event(send: Any, data: bytes) -> None:
    await send({"type": "http.response.body", "body": b"data: " + data + b"\n\n", "more_body": True})


async def start_stream(send: Any) -> None:
    await send({
        "type": "http.response.start", "status": 200,
        "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
    })


async def end_stream(send: Any) -> None:
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


async def respond(
    send: Any, status: int, body: bytes, ctype: bytes = b"application/json",
    extra_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode()), *(extra_headers or [])],
    })
    await send({"type": "http.response.body", "body": body})


async def read_body(receive: Any) -> bytes:
    raw = b""
    while True:
        msg = await receive()
        raw += bytes(msg.get("body", b""))
        if not msg.get("more_body"):
            return raw


async def lifespan(receive: Any, send: Any) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def run_uvicorn(app: Any, host: str, port: int) -> None:
    """Serve ``app`` in the foreground until SIGINT / SIGTERM (httptools parser, uvloop when present)."""
    import uvicorn

    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    uvicorn.run(
        app, host=host, port=port, loop=loop, http="httptools", log_level="warning", access_log=False,
        lifespan="on", timeout_keep_alive=60, backlog=4096,
        # a stop ends what is in flight after a quarter second: a test server never holds up the run that stops it
        timeout_graceful_shutdown=0.25,  # type: ignore[arg-type]  # a timeout of asyncio.wait_for: any number
    )
