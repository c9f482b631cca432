"""``loadgen sim``: a calibrated OpenAI-compatible server whose timing is the known truth.

Token i of a request that arrived at ``a`` is sent at ``a + ttft + i * itl`` on an absolute
schedule (sleeps target the deadline, so delays never accumulate). Times come from
``time.perf_counter`` (uvloop's loop clock has millisecond steps); how the simulator keeps
its deadlines despite wake-up latency is in ``SimApp._sleep_until``, and how late each
chunk actually left is exported on ``/metrics`` (``loadgen_sim_chunk_lateness_seconds``). ``max_tokens`` is
honoured exactly. Prompt length: a token-id prompt counts its ids; text counts whitespace
separated words; chat adds a ChatML-like template of ``5 per message + 3`` tokens.

Faults (``SimFaults``, ``loadgen sim --fault KIND=RATE``): each request draws at most one fault
from a seeded generator, in arrival order; how many of each were injected is on ``/metrics``
(``loadgen_sim_faults_total{kind=...}``), the truth a client's failure counts are checked
against. ``crash_after`` ends the process abruptly once that many requests have arrived.

It is a plain ASGI application served by uvicorn (httptools parser, uvloop when present).
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from loadgen.scenario.schema import FAULTS
from loadgen.servers.openai.asgi import (
    ASGIScope,
    end_stream,
    error,
    lifespan,
    models_list,
    read_body,
    respond,
    run_uvicorn,
    send_event,
    start_stream,
    usage,
)
from loadgen.workload.words import WORDS

CHAT_TOKENS_PER_MESSAGE = 5
CHAT_TOKENS_GENERATION_PROMPT = 3
# at or below this many running requests, the last SPIN_S before a deadline is spent yielding
SPIN_BELOW_RUNNING = 2
SPIN_S = 0.0015




@dataclass(frozen=True, slots=True)
class SimFaults:
    """Fault rates by kind (their sum at most 1) and their parameters."""

    rates: tuple[tuple[str, float], ...] = ()
    seed: int = 0
    retry_after_s: int = 1
    stall_s: float = 2.0
    slow_ttft_s: float = 0.5
    crash_after: int | None = None  # the process exits abruptly when this many requests have arrived

    def __post_init__(self) -> None:
        for kind, rate in self.rates:
            if kind not in FAULTS:
                raise ValueError(f"fault {kind!r}: choose one of {', '.join(FAULTS)}")
            if not 0 <= rate <= 1:
                raise ValueError(f"fault {kind}={rate}: a rate is between 0 and 1")
        if sum(r for _, r in self.rates) > 1 + 1e-9:
            raise ValueError("fault rates add up to more than 1")


@dataclass(frozen=True, slots=True)
class SimConfig:
    ttft_s: float = 0.050
    itl_s: float = 0.010
    tokens_per_chunk: int = 1
    model: str = "loadgen-sim"
    max_model_len: int = 1_000_000
    faults: SimFaults = field(default_factory=SimFaults)
    api_key: str | None = None  # when set, requests must carry "Authorization: Bearer <api_key>"


@dataclass(slots=True)
class SimStats:
    requests_total: int = 0
    requests_completed: int = 0
    requests_running: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    # how late each chunk left against its deadline: the simulator's own error
    chunks_timed: int = 0
    chunk_lateness_sum_s: float = 0.0
    chunk_lateness_max_s: float = 0.0
    chunk_lateness_min_s: float = 0.0
    faults: dict[str, int] = field(default_factory=dict)


def count_prompt_tokens(body: dict[str, Any], chat: bool) -> int:
    """The simulator's tokenizer: ids count one each, words one each, plus the chat template."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' must be a non-empty list")
        words = 0
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if not isinstance(content, str):
                raise ValueError("each message needs a string 'content'")
            words += len(content.split())
        return words + CHAT_TOKENS_PER_MESSAGE * len(messages) + CHAT_TOKENS_GENERATION_PROMPT
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) and prompt:
        return len(prompt)
    if isinstance(prompt, str):
        return len(prompt.split())
    raise ValueError("'prompt' must be a string or a non-empty list of token ids")


class SimApp:
    """The ASGI application; one instance per server, with its counters."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.stats = SimStats()
        self._created = int(time.time())
        self._lead_s = 0.0  # running estimate of how late a sleep wakes up
        self._fault_rng = random.Random(config.faults.seed)

    async def _sleep_until(self, deadline: float) -> None:
        """Sleep until ``deadline`` (perf_counter seconds).

        An idle process wakes about 1 ms late on a VM. Under load the simulator wakes early by
        its learnt lateness; when at most two requests run (where that lateness is largest
        and the CPU is free) it wakes 1.5 ms early. Either way a chunk that woke early yields
        to the event loop until its deadline, so it is never sent before it, and its own
        lateness stays well under a millisecond.
        """
        if self.stats.requests_running <= SPIN_BELOW_RUNNING:
            delay = deadline - SPIN_S - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        else:
            wake = deadline - self._lead_s
            delay = wake - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
                late = time.perf_counter() - wake
                # exponential average, bounded so a stall of the whole process does not poison it
                self._lead_s = min(max(self._lead_s + 0.05 * (late - self._lead_s), 0.0), 0.005)
        # never early: a woken-early chunk yields to the loop until its deadline
        while time.perf_counter() < deadline:  # noqa: ASYNC110 - a deliberate sub-ms spin
            await asyncio.sleep(0)

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
            await respond(send, 200, models_list(self.config.model, self._created, self.config.max_model_len))
        elif method == "GET" and path == "/metrics":
            await respond(send, 200, self._metrics(), b"text/plain; version=0.0.4")
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            arrival = time.perf_counter()
            key = self.config.api_key
            if key is not None and (b"authorization", b"Bearer " + key.encode()) not in scope["headers"]:
                await read_body(receive)
                await respond(send, 401, error("invalid or missing API key", "AuthenticationError"))
                return
            await self._generate(receive, send, arrival, chat=path.endswith("chat/completions"))
        else:
            await respond(send, 404, error(f"no route {method} {path}"))

    def _metrics(self) -> bytes:
        s = self.stats
        lines = [
            "# TYPE loadgen_sim_requests_total counter",
            f"loadgen_sim_requests_total {s.requests_total}",
            "# TYPE loadgen_sim_requests_completed_total counter",
            f"loadgen_sim_requests_completed_total {s.requests_completed}",
            "# TYPE loadgen_sim_requests_running gauge",
            f"loadgen_sim_requests_running {s.requests_running}",
            "# TYPE loadgen_sim_prompt_tokens_total counter",
            f"loadgen_sim_prompt_tokens_total {s.prompt_tokens_total}",
            "# TYPE loadgen_sim_generation_tokens_total counter",
            f"loadgen_sim_generation_tokens_total {s.generation_tokens_total}",
            "# TYPE loadgen_sim_chunk_lateness_seconds summary",
            f"loadgen_sim_chunk_lateness_seconds_count {s.chunks_timed}",
            f"loadgen_sim_chunk_lateness_seconds_sum {s.chunk_lateness_sum_s:.9f}",
            "# TYPE loadgen_sim_chunk_lateness_seconds_max gauge",
            f"loadgen_sim_chunk_lateness_seconds_max {s.chunk_lateness_max_s:.9f}",
            "# TYPE loadgen_sim_chunk_lateness_seconds_min gauge",
            f"loadgen_sim_chunk_lateness_seconds_min {s.chunk_lateness_min_s:.9f}",
            "# TYPE loadgen_sim_wake_lead_seconds gauge",
            f"loadgen_sim_wake_lead_seconds {self._lead_s:.9f}",
            "# TYPE loadgen_sim_faults_total counter",
            *(f'loadgen_sim_faults_total{{kind="{k}"}} {s.faults.get(k, 0)}' for k, _ in self.config.faults.rates),
        ]
        return ("\n".join(lines) + "\n").encode()

    def _draw_fault(self) -> str | None:
        """At most one fault for this request, in arrival order from the seeded generator."""
        rates = self.config.faults.rates
        if not rates:
            return None
        u = self._fault_rng.random()
        for kind, rate in rates:
            if u < rate:
                self.stats.faults[kind] = self.stats.faults.get(kind, 0) + 1
                return kind
            u -= rate
        return None

    async def _generate(self, receive: Any, send: Any, arrival: float, chat: bool) -> None:
        raw = await read_body(receive)
        self.stats.requests_total += 1
        faults = self.config.faults
        if faults.crash_after is not None and self.stats.requests_total >= faults.crash_after:
            os._exit(3)  # the crash: no response, no cleanup; open connections are closed by the kernel
        fault = self._draw_fault()
        if fault in ("http_429", "http_500", "http_503"):
            status = int(fault[5:])
            headers = [(b"retry-after", str(faults.retry_after_s).encode())] if status != 500 else []
            await respond(send, status, error(f"injected fault {fault}", "ServerError"), extra_headers=headers)
            return
        if fault == "reset":
            _reset(send)
            return
        try:
            body = orjson.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
            prompt_tokens = count_prompt_tokens(body, chat)
            max_tokens = int(body.get("max_tokens") or 16)
            if max_tokens < 1:
                raise ValueError("max_tokens must be >= 1")
        except (ValueError, TypeError) as exc:
            await respond(send, 400, error(str(exc)))
            return
        if prompt_tokens + max_tokens > self.config.max_model_len:
            await respond(send, 400, error("prompt + max_tokens exceeds max_model_len"))
            return
        self.stats.requests_running += 1
        self.stats.prompt_tokens_total += prompt_tokens
        try:
            if fault == "slow_ttft":
                arrival += faults.slow_ttft_s
            if body.get("stream"):
                if await self._stream(send, body, arrival, chat, prompt_tokens, max_tokens, fault):
                    self.stats.requests_completed += 1
            else:
                await self._whole(send, arrival, chat, prompt_tokens, max_tokens)
                self.stats.requests_completed += 1
        finally:
            self.stats.requests_running -= 1

    async def _whole(
        self, send: Any, arrival: float, chat: bool, prompt_tokens: int, max_tokens: int
    ) -> None:
        cfg = self.config
        await self._sleep_until(arrival + cfg.ttft_s + (max_tokens - 1) * cfg.itl_s)
        text = "".join(" " + WORDS[i % len(WORDS)] for i in range(max_tokens))
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        self.stats.generation_tokens_total += max_tokens
        await respond(send, 200, orjson.dumps({
            "id": "cmpl-sim", "object": "chat.completion" if chat else "text_completion",
            "created": self._created, "model": self.config.model, "choices": [choice],
            "usage": usage(prompt_tokens, max_tokens),
        }))

    async def _stream(
        self,
        send: Any,
        body: dict[str, Any],
        arrival: float,
        chat: bool,
        prompt_tokens: int,
        max_tokens: int,
        fault: str | None = None,
    ) -> bool:
        """Stream the tokens; False when a fault cut the stream short."""
        cfg = self.config
        half = max(1, max_tokens // 2)  # where mid-stream faults strike: after this many tokens
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage"))
        continuous = include_usage and bool(options.get("continuous_usage_stats"))
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = (
            f'{{"id":"cmpl-sim","object":"{obj}","created":{self._created},'
            f'"model":"{cfg.model}","choices":['
        ).encode()
        await start_stream(send)
        if chat:  # like vLLM: a role-only delta first, which carries no token
            role = b'{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}'
            await send_event(send, head + role + b"]}")
        step = cfg.tokens_per_chunk
        shift = 0.0
        for start in range(0, max_tokens, step):
            end = min(start + step, max_tokens)
            if start >= half and fault in ("stream_cut", "malformed_json", "stall"):
                if fault == "stream_cut":
                    _reset(send)
                    return False
                if fault == "malformed_json":
                    await send_event(send, head + b'{"index":0,"text":"' + b"oops")
                    fault = None  # the client is expected to give up here; the rest goes unread
                if fault == "stall":
                    shift, fault = cfg.faults.stall_s, None
            deadline = arrival + cfg.ttft_s + (end - 1) * cfg.itl_s + shift
            await self._sleep_until(deadline)
            text = "".join(" " + WORDS[i % len(WORDS)] for i in range(start, end))
            finish = b'"length"' if end == max_tokens else b"null"
            if chat:
                choice = b'{"index":0,"delta":{"content":"' + text.encode() + b'"},"finish_reason":'
            else:
                choice = b'{"index":0,"text":"' + text.encode() + b'","logprobs":null,"finish_reason":'
            tail = b"]}"
            if continuous:
                tail = b'],"usage":' + orjson.dumps(usage(prompt_tokens, end)) + b"}"
            late = time.perf_counter() - deadline
            if fault == "missing_prefix":
                await send({"type": "http.response.body", "body": head + choice + finish + b"}" + tail + b"\n\n",
                            "more_body": True})
            else:
                await send_event(send, head + choice + finish + b"}" + tail)
            st = self.stats
            st.generation_tokens_total += end - start
            st.chunks_timed += 1
            st.chunk_lateness_sum_s += late
            st.chunk_lateness_max_s = max(st.chunk_lateness_max_s, late)
            st.chunk_lateness_min_s = late if st.chunks_timed == 1 else min(st.chunk_lateness_min_s, late)
        if include_usage:
            claimed = max_tokens + 1 if fault == "usage_mismatch" else max_tokens
            totals = orjson.dumps(usage(prompt_tokens, claimed))
            await send_event(send, head + b'],"usage":' + totals + b"}")
        if fault == "no_done":
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await end_stream(send)
        return True


def _reset(send: Any) -> None:
    """Abort the connection with a TCP RST (SO_LINGER 0), as a crashing proxy or server does.

    uvicorn's ``send`` is a bound method of the request cycle, which holds the transport."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is None:
        raise RuntimeError("the ASGI server does not expose its transport; cannot inject a reset")
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def serve_sim(config: SimConfig, host: str = "127.0.0.1", port: int = 8100) -> None:
    """Run the simulator in the foreground until SIGINT / SIGTERM."""
    run_uvicorn(SimApp(config), host, port)
