"""``loadgen sim``: a calibrated OpenAI-compatible server whose timing is the known truth.

Token i of a request that arrived at ``a`` is sent at ``a + ttft + i * itl`` on an absolute
schedule (sleeps target the deadline, so delays never accumulate).

With a capacity (``SimOptions.max_seqs``, ``itl_per_seq_us``, ``prefill_per_token_us``) the
simulator serves like a batching engine whose truth is still exact: at most ``max_seqs``
requests are served at once and the rest wait in arrival order; a request is *admitted* at
``s`` (its arrival, or the moment a served request ended and passed it the slot) while ``k``
others are being served, and then streams token i at
``s + ttft + prompt_tokens * prefill_per_token + i * (itl + k * itl_per_seq) * f``, where ``f``
is 1, or with ``jitter`` a seeded normal draw of mean 1 per request (arrival order). Its TTFT as a
client sees it is that plus the wait ``s - a``. A client that hangs up is dropped at the next
token it would have been sent (or when its turn comes, if it was waiting), as engines abort
requests whose connection closed. Times come from
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
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from prometheus_client.metrics_core import CounterMetricFamily, Metric, SummaryMetricFamily

from loadgen.data import RequestBody
from loadgen.scenario.serve import SimOptions
from loadgen.servers.openai.app import OpenAIApp, Route, counter, gauge
from loadgen.servers.openai.asgi import (
    ASGIScope,
    end_stream,
    hung_up,
    read_body,
    respond,
    run_uvicorn,
    send_event,
    start_stream,
)
from loadgen.servers.openai.protocol import StreamOptions, object_name, request_body, usage, whole_answer
from loadgen.servers.openai.responses import Stored, chat_body, embedding_answer, embedding_inputs
from loadgen.servers.openai.rules import Ask, RequestRefused, ask_of, error_body, request_id, stop_at
from loadgen.servers.openai.structured import answer_tokens, call_tokens, tool_call
from loadgen.servers.simprompt import PrefixCache, tokenize_prompt
from loadgen.servers.simresponses import respond_responses
from loadgen.workload.words import WORDS

# at or below this many running requests, the last SPIN_S before a deadline is spent yielding
SPIN_BELOW_RUNNING = 2
SPIN_S = 0.0015




@dataclass(slots=True)
class SimStats:
    requests_total: int = 0
    requests_completed: int = 0
    requests_running: int = 0
    requests_waiting: int = 0  # queued for a slot (only with max_seqs)
    requests_aborted: int = 0  # the client hung up before the last token
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    # how late each chunk left against its deadline: the simulator's own error
    chunks_timed: int = 0
    chunk_lateness_sum_s: float = 0.0
    chunk_lateness_max_s: float = 0.0
    chunk_lateness_min_s: float = 0.0
    faults: dict[str, int] = field(default_factory=dict)

    def timed(self, late: float) -> None:
        """A chunk (or a whole embeddings answer) that left ``late`` seconds after its deadline."""
        self.chunks_timed += 1
        self.chunk_lateness_sum_s += late
        self.chunk_lateness_max_s = max(self.chunk_lateness_max_s, late)
        self.chunk_lateness_min_s = late if self.chunks_timed == 1 else min(self.chunk_lateness_min_s, late)


class SimApp(OpenAIApp):
    """The ASGI application; one instance per server, with its counters."""

    def __init__(self, config: SimOptions, api_key: str | None = None) -> None:
        super().__init__(config.model, config.max_model_len)
        self.config = config
        self.api_key = api_key  # when set, requests must carry "Authorization: Bearer <api_key>"
        self.stats = SimStats()
        self.cache = PrefixCache()
        self.stored = Stored()  # the Responses API's stored answers, for previous_response_id
        self._created = self.created
        self._lead_s = 0.0  # running estimate of how late a sleep wakes up
        self._fault_rng = random.Random(config.fault_seed)
        self._jitter_rng = random.Random(config.jitter_seed)
        self._serving = 0  # admitted and not yet finished (the occupancy k is counted from)
        self._queue: deque[asyncio.Future[float]] = deque()  # waiting for a slot, in arrival order

    async def _admit(self, arrival: float) -> tuple[float, int]:
        """Wait for a slot; returns when the request was admitted and how many others were
        being served then. A waiter is admitted at the moment the slot was freed, not when
        its coroutine wakes, so the schedule stays exact."""
        cap = self.config.max_seqs
        if cap is None or (self._serving < cap and not self._queue):
            self._serving += 1
            return arrival, self._serving - 1
        slot: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._queue.append(slot)
        self.stats.requests_waiting += 1
        try:
            admitted = await slot
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled():
                self._release()  # handed a slot while being cancelled: pass it on
            raise
        finally:
            self.stats.requests_waiting -= 1
            if not slot.done():
                slot.cancel()
                self._queue.remove(slot)
        return admitted, self._serving - 1

    def _release(self) -> None:
        """A served request ended: its slot goes to the first waiter still waiting."""
        now = time.perf_counter()
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.done():
                waiter.set_result(now)  # the occupancy stays: the slot changes hands
                return
        self._serving -= 1

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

    def routes(self) -> dict[tuple[str, str], Route]:
        return {("POST", "/reset_prefix_cache"): self._reset_cache}

    async def _reset_cache(self, receive: Any, send: Any) -> None:
        await read_body(receive)
        self.cache.reset()
        await respond(send, 200, b'{"success":true}')

    async def complete(self, scope: ASGIScope, receive: Any, send: Any, *, chat: bool, responses: bool = False) -> None:
        arrival = time.perf_counter()
        key = self.api_key
        if key is not None and (b"authorization", b"Bearer " + key.encode()) not in scope["headers"]:
            await read_body(receive)
            await respond(send, 401, error_body("invalid or missing API key", "AuthenticationError", 401))
            return
        await self._generate(receive, send, arrival, chat=chat, responses=responses)

    async def responses(self, scope: ASGIScope, receive: Any, send: Any) -> None:
        await self.complete(scope, receive, send, chat=True, responses=True)

    async def embeddings(self, scope: ASGIScope, receive: Any, send: Any) -> None:
        """A vector of 8 per input, after --ttft-ms and --embedding-per-token-us per input token,
        served within max_seqs as completions are."""
        arrival, cfg = time.perf_counter(), self.config
        raw = await read_body(receive)
        key = self.api_key
        if key is not None and (b"authorization", b"Bearer " + key.encode()) not in scope["headers"]:
            await respond(send, 401, error_body("invalid or missing API key", "AuthenticationError", 401))
            return
        self.stats.requests_total += 1
        texts, tokens = embedding_inputs(raw, cfg.model)
        if isinstance(texts, RequestRefused):
            await respond(send, texts.code, texts.body())
            return
        admitted, _ = await self._admit(arrival)
        try:
            self.stats.requests_running += 1
            self.stats.prompt_tokens_total += tokens
            deadline = admitted + cfg.ttft_s + tokens * cfg.embedding_per_token_us / 1e6
            await self._sleep_until(deadline)
            answer = embedding_answer(cfg.model, len(texts), tokens)
            self.stats.timed(time.perf_counter() - deadline)
            await respond(send, 200, answer)
            self.stats.requests_completed += 1
        finally:
            self.stats.requests_running -= 1
            if cfg.max_seqs is None:
                self._serving -= 1
            else:
                self._release()

    def metric_families(self) -> Iterable[Metric]:
        s = self.stats
        yield counter("loadgen_sim_requests", "requests received", s.requests_total)
        yield counter("loadgen_sim_requests_completed", "requests answered in full", s.requests_completed)
        yield gauge("loadgen_sim_requests_running", "requests being answered", s.requests_running)
        yield gauge("loadgen_sim_requests_waiting", "requests queued for a slot (max_seqs)", s.requests_waiting)
        yield counter("loadgen_sim_requests_aborted", "requests whose client hung up before the end",
                      s.requests_aborted)
        yield counter("loadgen_sim_prompt_tokens", "prompt tokens of the requests answered", s.prompt_tokens_total)
        yield counter("loadgen_sim_generation_tokens", "output tokens sent", s.generation_tokens_total)
        yield SummaryMetricFamily(
            "loadgen_sim_chunk_lateness_seconds", "how late each chunk (or embeddings answer) left after its deadline",
            count_value=s.chunks_timed, sum_value=s.chunk_lateness_sum_s,
        )
        yield gauge("loadgen_sim_chunk_lateness_seconds_max", "latest chunk", s.chunk_lateness_max_s)
        yield gauge("loadgen_sim_chunk_lateness_seconds_min", "earliest chunk (never below 0)", s.chunk_lateness_min_s)
        yield gauge("loadgen_sim_wake_lead_seconds", "how early the simulator wakes before a deadline", self._lead_s)
        yield counter("loadgen_sim_prefix_cache_queries", "prompt tokens looked up in the cache", self.cache.queries)
        yield counter("loadgen_sim_prefix_cache_hits", "prompt tokens found in the prefix cache", self.cache.hits)
        faults = CounterMetricFamily("loadgen_sim_faults", "faults injected, by kind", labels=["kind"])
        for kind in self.config.faults:
            faults.add_metric([kind], s.faults.get(kind, 0))
        yield faults

    def _draw_fault(self) -> str | None:
        """At most one fault for this request, in arrival order from the seeded generator."""
        rates = self.config.faults
        if not rates:
            return None
        u = self._fault_rng.random()
        for kind, rate in rates.items():
            if u < rate:
                self.stats.faults[kind] = self.stats.faults.get(kind, 0) + 1
                return kind
            u -= rate
        return None

    async def _generate(self, receive: Any, send: Any, arrival: float, chat: bool, responses: bool = False) -> None:
        raw = await read_body(receive)
        self.stats.requests_total += 1
        cfg = self.config
        if cfg.crash_after is not None and self.stats.requests_total >= cfg.crash_after:
            os._exit(3)  # the crash: no response, no cleanup; open connections are closed by the kernel
        fault = self._draw_fault()
        if fault in ("http_429", "http_500", "http_503"):
            status = int(fault[5:])
            headers = [(b"retry-after", str(cfg.retry_after_s).encode())] if status != 500 else []
            await respond(send, status, error_body(f"injected fault {fault}", "ServerError", status),
                          extra_headers=headers)
            return
        if fault == "reset":
            _reset(send)
            return
        try:
            body = given = request_body(raw)
            if responses:  # the Responses API's request, read as the chat request it amounts to
                body = chat_body(body, self.stored)
            for name in self.config.reject_params:
                if name in body:
                    raise ValueError(f"Unrecognized request argument supplied: {name}")
            tokens = tokenize_prompt(body, chat, cfg.image_tokens)
            ask = ask_of(body, chat=chat, served=cfg.model, prompt_tokens=len(tokens), max_model_len=cfg.max_model_len)
        except RequestRefused as exc:
            await respond(send, exc.code, exc.body())
            return
        except (ValueError, TypeError) as exc:
            await respond(send, 400, error_body(str(exc)))
            return
        prompt_tokens = len(tokens)
        speed = max(0.0, self._jitter_rng.gauss(1.0, cfg.jitter)) if cfg.jitter else 1.0
        admitted, others = await self._admit(arrival)
        try:
            if hung_up(send):
                self.stats.requests_aborted += 1
                return
            # counted (and reported per request) only: cached tokens do not shorten the simulated TTFT
            cached = self.cache.lookup(tokens)
            self.stats.requests_running += 1
            self.stats.prompt_tokens_total += prompt_tokens
            timing = _Timing(
                start=admitted + cfg.ttft_s + prompt_tokens * cfg.prefill_per_token_s
                + (cfg.slow_ttft_s if fault == "slow_ttft" else 0.0),
                itl=(cfg.itl_s + others * cfg.itl_per_seq_s) * speed,
            )
            try:
                if responses:
                    if await respond_responses(self, send, body, timing, given, prompt_tokens, ask.max_tokens,
                                               cached):
                        self.stats.requests_completed += 1
                elif body.get("stream"):
                    if await self._stream(send, body, timing, chat, prompt_tokens, ask, fault, cached):
                        self.stats.requests_completed += 1
                else:
                    prompt = body.get("prompt")
                    await self._whole(send, body, timing, chat, prompt_tokens, ask, cached,
                                      prompt if isinstance(prompt, str) else "")
                    self.stats.requests_completed += 1
            finally:
                self.stats.requests_running -= 1
        finally:
            if self.config.max_seqs is None:
                self._serving -= 1
            else:
                self._release()

    def _structured(self, body: RequestBody, count: int) -> list[str] | None:
        """The answer's tokens when the request asks for JSON (and the simulator gives it)."""
        return answer_tokens(body, count) if self.config.structured_output else None

    async def _whole(self, send: Any, body: RequestBody, timing: _Timing, chat: bool, prompt_tokens: int, ask: Ask,
                     cached: int, prompt: str) -> None:
        words = self._structured(body, ask.max_tokens) or [" " + WORDS[i % len(WORDS)] for i in range(ask.max_tokens)]
        stopped = stop_at(words, ask.stop)
        count, text = stopped if stopped is not None else (ask.max_tokens, "".join(words))
        await self._sleep_until(timing.start + (count - 1) * timing.itl)
        self.stats.generation_tokens_total += count * ask.n
        wanted = tool_call(body) if chat else None
        call = None
        if wanted is not None:  # (name, its arguments as JSON text)
            called = call_tokens(wanted[0], wanted[1], ask.max_tokens)
            call = (wanted[0], "".join(called[1:]) or called[0][len(wanted[0]):])
        await respond(send, 200, whole_answer(
            chat=chat, id_=request_id(chat), created=self._created, model=self.config.model,
            text=(prompt + text) if ask.echo else text, words=words[:count], ask=ask,
            finish="stop" if stopped is not None else "length", prompt_tokens=prompt_tokens,
            completion_tokens=count, cached=cached, tool_call=call,
        ))

    async def _stream(
        self,
        send: Any,
        body: RequestBody,
        timing: _Timing,
        chat: bool,
        prompt_tokens: int,
        ask: Ask,
        fault: str | None = None,
        cached: int = 0,
    ) -> bool:
        """Stream the tokens; False when a fault cut the stream short."""
        cfg = self.config
        options = StreamOptions.of(body)
        include_usage, continuous = options.include_usage, options.continuous
        obj = object_name(chat, streamed=True)
        max_tokens, choices = ask.max_tokens, range(ask.n)
        words = [" " + WORDS[i % len(WORDS)] for i in range(max_tokens)] if ask.stop else []
        stopped = stop_at(words, ask.stop)
        structured = self._structured(body, max_tokens)  # JSON text, escaped into each chunk
        call = tool_call(body) if chat else None  # a chat request with tools: the answer calls one
        called = call_tokens(call[0], call[1], max_tokens) if call is not None else []
        if stopped is not None:  # the stream ends with the token that completed a stop string, which is not sent
            max_tokens = stopped[0]
        half = max(1, max_tokens // 2)  # where mid-stream faults strike: after this many tokens
        # chunks are written as bytes from a template: the simulator's hot path, kept cheap so
        # that its own lateness stays far below what it simulates
        head = (
            f'{{"id":"{request_id(chat)}","object":"{obj}","created":{self._created},'
            f'"model":"{cfg.model}","choices":['
        ).encode()
        await start_stream(send)
        if chat:  # like vLLM: a role-only delta first, which carries no token
            for c in choices:
                role = b'{"index":%d,"delta":{"role":"assistant","content":""},"finish_reason":null}' % c
                await send_event(send, head + role + b"]}")
        step = cfg.tokens_per_chunk
        thinking = cfg.reasoning_tokens  # chunks ending at or before this token are thinking
        shift = 0.0
        if fault == "overrun":  # a server that ignores max_tokens: on until the client hangs up
            max_tokens, continuous = max_tokens * 1000, False
        for start in range(0, max_tokens, step):
            end = min(start + step, max_tokens)
            if start >= half and fault in ("stream_cut", "malformed_json", "stall", "wrong_types"):
                if fault == "stream_cut":
                    _reset(send)
                    return False
                if fault == "malformed_json":
                    await send_event(send, head + b'{"index":0,"text":"' + b"oops")
                    fault = None  # the client is expected to give up here; the rest goes unread
                if fault == "stall":
                    shift, fault = cfg.stall_s, None
                if fault == "wrong_types":
                    await send_event(send, head[:head.rindex(b'"choices":[')] + b'"choices":5}')
                    fault = None
            deadline = timing.start + (end - 1) * timing.itl + shift
            await self._sleep_until(deadline)
            if hung_up(send):
                self.stats.requests_aborted += 1
                return False
            if stopped is not None and end == max_tokens:
                text = stopped[1][len("".join(words[:start])):]  # the text before the stop string
            elif structured is not None:
                text = orjson.dumps("".join(structured[start:end])).decode()[1:-1]
            else:
                text = "".join(" " + WORDS[i % len(WORDS)] for i in range(start, end))
            finish = b"null" if end < max_tokens else b'"stop"' if stopped is not None else b'"length"'
            tail = b"]}"
            if continuous:
                tail = b'],"usage":' + orjson.dumps(usage(prompt_tokens, end * ask.n)) + b"}"
            late = time.perf_counter() - deadline
            if call is not None:  # the function's name on the first delta, its arguments after
                args = "".join(called[max(start, 1):end]) if start or end > 1 else called[0][len(call[0]):]
                first = (b'"id":"call_' + request_id(False)[5:].encode() + b'","type":"function",'
                         if start == 0 else b"")
                name = b'"name":' + orjson.dumps(call[0]) + b"," if start == 0 else b""
                finish = b'"tool_calls"' if end == max_tokens else b"null"
            for c in choices:
                if call is not None:
                    choice = (b'{"index":%d,"delta":{"tool_calls":[{"index":0,' % c + first + b'"function":{' + name
                              + b'"arguments":' + orjson.dumps(args) + b'}}]},"finish_reason":')
                elif chat:
                    field = b"reasoning_content" if end <= thinking else b"content"
                    choice = b'{"index":%d,"delta":{"' % c + field + b'":"' + text.encode() + b'"},"finish_reason":'
                else:
                    choice = b'{"index":%d,"text":"' % c + text.encode() + b'","logprobs":null,"finish_reason":'
                if fault == "missing_prefix":
                    await send({"type": "http.response.body", "body": head + choice + finish + b"}" + tail + b"\n\n",
                                "more_body": True})
                else:
                    await send_event(send, head + choice + finish + b"}" + tail)
            self.stats.generation_tokens_total += (end - start) * ask.n
            self.stats.timed(late)
        if include_usage:
            claimed = {"usage_mismatch": max_tokens + 1, "usage_huge": 10**9}.get(fault or "", max_tokens * ask.n)
            totals = orjson.dumps({**usage(prompt_tokens, claimed), "prompt_tokens_details": {"cached_tokens": cached}})
            await send_event(send, head + b'],"usage":' + totals + b"}")
        if fault == "no_done":
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await end_stream(send)
        return True


@dataclass(frozen=True, slots=True)
class _Timing:
    """When a request's first token leaves (perf_counter seconds) and the gap after each."""

    start: float
    itl: float


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


def serve_sim(config: SimOptions, api_key: str | None = None, host: str = "127.0.0.1", port: int = 8100) -> None:
    """Run the simulator in the foreground until SIGINT / SIGTERM."""
    run_uvicorn(SimApp(config, api_key), host, port)
