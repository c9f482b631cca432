"""``OpenAIApp``: the ASGI application loadgen's servers build on.

It routes ``GET /health``, ``GET /v1/models``, ``GET /metrics`` (prometheus_client's text
format, from the metric families the server yields at scrape time, so counting costs the hot
path nothing) and the two completion endpoints; a server adds its own routes and implements
``complete``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from loadgen.servers.openai.asgi import ASGIScope, lifespan, respond
from loadgen.servers.openai.protocol import error, models_list

Route = Callable[[Any, Any], Awaitable[None]]


def counter(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> CounterMetricFamily:
    """A counter family (exposed as ``name_total``) with one sample."""
    family = CounterMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


def gauge(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


class _Families(Collector):
    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return self._collect()


class OpenAIApp:
    """Routing shared by the simulator and the transformers engine."""

    not_found = "NotFoundError"

    def __init__(self, model: str, max_model_len: int) -> None:
        self.model = model
        self.max_model_len = max_model_len
        self.created = int(time.time())
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Families(self.metric_families))

    def metric_families(self) -> Iterable[Metric]:
        """What ``/metrics`` shows; read at scrape time."""
        return ()

    def routes(self) -> dict[tuple[str, str], Route]:
        """(method, path) -> handler(receive, send), beside the standard routes."""
        return {}

    async def complete(self, scope: ASGIScope, receive: Any, send: Any, *, chat: bool) -> None:
        raise NotImplementedError

    async def embeddings(self, scope: ASGIScope, receive: Any, send: Any) -> None:
        """``POST /v1/embeddings``: not served unless a server says otherwise."""
        await respond(send, 404, error("embeddings are not served here", self.not_found, 404))

    async def responses(self, scope: ASGIScope, receive: Any, send: Any) -> None:
        """``POST /v1/responses``: not served unless a server says otherwise."""
        await respond(send, 404, error("the Responses API is not served here: use /v1/chat/completions",
                                       self.not_found, 404))

    async def __call__(self, scope: ASGIScope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path == "/health":
            await respond(send, 200, b"")
        elif method == "GET" and path == "/v1/models":
            await respond(send, 200, models_list(self.model, self.created, self.max_model_len))
        elif method == "GET" and path == "/metrics":
            await respond(send, 200, generate_latest(self.registry), CONTENT_TYPE_LATEST.encode())
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            await self.complete(scope, receive, send, chat=path.endswith("chat/completions"))
        elif method == "POST" and path == "/v1/responses":
            await self.responses(scope, receive, send)
        elif method == "POST" and path == "/v1/embeddings":
            await self.embeddings(scope, receive, send)
        elif (handler := self.routes().get((method, path))) is not None:
            await handler(receive, send)
        else:
            await respond(send, 404, error(f"no route {method} {path}", self.not_found, 404))
