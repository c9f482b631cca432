"""The Locust user's HTTP side, on geventhttpclient: one keep-alive connection per user, the
model lookup and calibration probes of a run, and one streaming request read to its end
into loadgen's stream accounting (``loadgen.load.stream``), with loadgen's timeouts and
failure classes. Never raises for a failed request.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import gevent
import gevent.socket
import orjson
from geventhttpclient import HTTPClient
from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError
from geventhttpclient.url import URL

from loadgen.errors import LoadgenError, UsageError
from loadgen.load.connection import CLOSE_HABIT_NS, STARVE_ENV
from loadgen.load.sidecall import PAGE_MAX_BYTES, SIDE_CALL_S
from loadgen.load.stamped import ANCILLARY, SO_TIMESTAMPNS, TIMESPEC, keep_stamping, kernel_clock_problem
from loadgen.load.stream import StreamState, error_snippet
from loadgen.load.target import pick_model
from loadgen.locust.health import READS
from loadgen.locust.plan import LocustPlan, schedule
from loadgen.results.records import FailureClass
from loadgen.scenario.matrix import Cell
from loadgen.scenario.target import Timeouts
from loadgen.scenario.wire import redact_url, split_userinfo
from loadgen.workload.payload import ENDPOINTS, api_key, auth_headers, with_basic_auth
from loadgen.workload.prompts import (
    RequestPool,
    Stream,
    TextCalibration,
    calibration_from,
    calibration_requests,
    needs_calibration,
    prepare_requests,
    read_sources,
)
from loadgen.workload.sessions import Turns, turns_of


@dataclass
class Workbench:
    """What the users of one process send: built once per (host, scenario) before the first request."""

    host: str
    path: str
    headers: dict[str, str]
    timeouts: Timeouts
    model: str
    pool: RequestPool
    calibration: TextCalibration
    next_prompt: itertools.count[int] = field(default_factory=itertools.count)
    # a dataset's entries (or a session file's sessions): each sent once per test, shared out
    # between the workers (None: generated prompts, never a repeat)
    entries: int | None = None
    next_entry: itertools.count[int] = field(default_factory=itertools.count)
    # a trace's rows: each due at its offset after the test's start (the users wait for it)
    offsets: tuple[float, ...] = ()
    turns: Turns | None = None  # multi-turn sessions: each user runs whole sessions
    next_session: itertools.count[int] = field(default_factory=itertools.count)
    kernel_clock: bool = False  # the answers' bytes timed by the kernel's receive stamps (``clock_of``)
    # an open loop: its schedule, made afresh for each test (``schedule``), and this process's
    # share of the test's arrivals, (arrival number, offset) in order
    schedule: Callable[[], tuple[Iterator[float], int | None] | None] = lambda: None
    next_arrival: Iterator[tuple[int, float]] | None = None
    arrivals: int | None = None  # the schedule's length (None: endless)

    def share(self, index: int, count: int) -> None:
        """This process's share of the test starting: a dataset's entries index, index + count,
        ..., and as many of an open loop's arrivals, the rest going to the other processes."""
        self.next_entry = itertools.count(index, count)
        made = self.schedule()
        if made is not None:
            offsets, self.arrivals = made
            self.next_arrival = itertools.islice(enumerate(offsets), index, None, count)


def build_workbench(plan: LocustPlan, host: str, seed: int, process: int) -> Workbench:
    """Model, calibration and this process's prompts (stream LOCUST of ``process``: unique in the
    run whatever the seed, made on demand as the users ask for more)."""
    target = plan.scenario.target
    base, userinfo = split_userinfo(host.rstrip("/"))
    url = URL(base + ENDPOINTS[target.api])
    headers = {**auth_headers(target, api_key(target)), "Accept-Encoding": "identity"}
    headers = with_basic_auth(headers, userinfo or os.environ.get(BASIC_AUTH_ENV))
    t = target.timeouts
    kernel, _ = clock_of(plan, base)
    http = open_client(url, t, kernel_clock=kernel)
    try:
        model = target.model
        if model == "auto":
            model = fetch_model(http, URL(base + "/models"), headers)
        calibration = TextCalibration()
        if needs_calibration(plan.scenario):
            points = []
            for words, body in calibration_requests(plan.scenario, model, seed, process):
                st = StreamState()
                stream_request(http, url.request_uri, body, headers, t, st)
                points.append((words, st.prompt_tokens))
            calibration = calibration_from(points)
    finally:
        http.close()
    cell = Cell(process, plan.input_tokens, plan.output_tokens, None, None, plan.scenario)
    w = plan.scenario.workload
    sources = read_sources(plan.scenario, seed, None) if w.source != "generated" else None
    # none made ahead: the users' first requests go out at once whatever num_prompts is, and
    # memory does not grow with it
    pool = prepare_requests(cell, model, calibration, seed, Stream.LOCUST, count=0, sources=sources)
    turns = None if w.multi_turn is None else turns_of(pool.maker)
    entries = None
    if sources is not None:
        entries = sources.session_count or (len(sources.trace) if sources.trace else len(sources.samples))
    return Workbench(base, url.request_uri, headers, t, model, pool, calibration, entries=entries,
                     offsets=tuple(row.offset_s for row in sources.trace) if sources is not None else (),
                     turns=turns, kernel_clock=kernel, schedule=lambda: schedule(plan, seed))


# a test's hold on the core after each line of an event (as loadgen run's after each read)
STARVE_S = float(os.environ.get(STARVE_ENV) or 0) / 1e3


def clock_of(plan: LocustPlan, host: str) -> tuple[bool, str | None]:
    """Whether the kernel's receive stamps time the answers' bytes (``load.clock``: ``auto``
    where they can, as loadgen run), and why not where they do not."""
    clock = plan.scenario.load.clock
    problem = kernel_clock_problem(host.startswith("https:"))
    if clock == "kernel" and problem is not None:
        raise UsageError(f"load.clock kernel: {problem}; set load.clock: auto (or loop)")
    if clock == "loop":
        return False, "load.clock: loop"
    return problem is None, problem


class StampedSocket(gevent.socket.socket):  # type: ignore[misc]  # gevent's socket is untyped
    """A connection whose every read keeps the kernel's receive stamp of its bytes, on the
    monotonic clock (``arrived_ns``), and when the client handled it (``handled_ns``). The HTTP
    client reads only when the lines it holds are used up, so a line's bytes came in the latest
    read: its stamp is their arrival, however late the user's greenlet got to them."""

    arrived_ns = -1
    handled_ns = -1
    sent_ns = -1  # when the last request was handed to the kernel (-1: the first, on a new connection)
    fresh = True

    def sendall(self, data: bytes, flags: int = 0) -> None:
        # the send's time is taken here, at the write: between the user's call and this, the
        # connection pool may yield to other users, whose reads would land in this TTFT. Not on
        # a new connection: its setup counts in the first request's TTFT, as in loadgen run
        self.sent_ns = -1 if self.fresh else time.perf_counter_ns()
        self.fresh = False
        super().sendall(data, flags)

    def recv(self, size: int, flags: int = 0) -> bytes:
        data, ancillary, _, _ = self.recvmsg(size, ANCILLARY, flags)
        handled = time.perf_counter_ns()
        arrived = handled
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= TIMESPEC.size:
                sec, nsec = TIMESPEC.unpack_from(payload)
                # the stamp is on the wall clock: moved onto the monotonic one, never after now
                arrived = min(sec * 1_000_000_000 + nsec - (time.time_ns() - time.perf_counter_ns()), handled)
        self.arrived_ns, self.handled_ns = arrived, handled
        READS.count += 1
        READS.read_ns += time.perf_counter_ns() - handled
        READS.delays.append(handled - arrived)
        return bytes(data)


_KEEP_STAMPING: list[socket.socket] = []  # this process's, open for its life (``keep_stamping``)


def _stamped_sockets(http: HTTPClient) -> None:
    """The client's connections opened as ``StampedSocket``s, asking the kernel for its stamps
    (kept on for the whole process: a user's connection, opened after the calibration's closed,
    got its first bytes unstamped, timed as on the loop's clock: an ITL of 30 ms against 10 in a
    test whose user is held 30 ms after each event)."""
    if not _KEEP_STAMPING:
        _KEEP_STAMPING.append(keep_stamping())

    def create(family: int, kind: int, proto: int) -> StampedSocket:
        sock = StampedSocket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        setattr(http, "loadgen_socket", sock)  # noqa: B010 - the user's one connection (``stamped_socket``)
        return sock

    setattr(http._connection_pool, "_create_tcp_socket", create)  # noqa: B010 - an instance's factory


# the user:password of a --host, kept out of Locust's command line and web page, for the users
BASIC_AUTH_ENV = "LOADGEN_LOCUST_BASIC_AUTH"
# a file loadgen creates when it stops Locust (a signal, Ctrl-C): the run is then labelled interrupted
STOP_FILE_ENV = "LOADGEN_LOCUST_STOP_FILE"
# a file Locust's master (or its only process) creates once it begins to quit: a stop loadgen
# heard then needs no signal of its own (the same signal reached Locust, in loadgen's group)
QUITTING_FILE_ENV = "LOADGEN_LOCUST_QUITTING_FILE"


def stamped_socket(http: HTTPClient) -> StampedSocket | None:
    """The connection of a user's client (one at a time), as its last one opened: the response
    lets go of it as soon as the answer is whole, which for a short answer read late is before
    its first line is handed over (such a request was timed by the loop's clock: TTFT 91 ms and
    ITL 30 against 50 and 10, its user held 30 ms after each event)."""
    sock = getattr(http, "loadgen_socket", None)
    return sock if isinstance(sock, StampedSocket) else None


def open_client(url: URL, t: Timeouts, *, kernel_clock: bool = False) -> HTTPClient:
    # one connection per user, kept alive: the asyncio client's model
    http = HTTPClient.from_url(
        url, concurrency=1,
        connection_timeout=t.connect_s or 3600.0, network_timeout=t.between_tokens_s or 3600.0,
    )
    _watch_closes(http)
    if kernel_clock:
        _stamped_sockets(http)
    return http


def _watch_closes(http: HTTPClient) -> None:
    """Count the kept connections the server closed within ``CLOSE_HABIT_NS`` of their answer
    (``closed_after_answer``). The client checks a kept connection before it reuses one and
    quietly opens a new one where the server's close has come: only where the close came later
    was a request sent again, so on a busy machine a server that closes after each answer went
    unnoticed. (The pool's own check, wrapped: geventhttpclient has no hook for it.)"""
    pool = http._connection_pool
    returned: dict[int, int] = {}
    put_back, alive = pool.return_socket, pool._is_socket_alive
    closes = [0]

    def return_socket(sock: Any) -> None:
        returned[id(sock)] = time.perf_counter_ns()
        put_back(sock)

    def is_alive(sock: Any) -> bool:
        ok = alive(sock)
        at = returned.pop(id(sock), None)
        if not ok and at is not None and time.perf_counter_ns() - at < CLOSE_HABIT_NS:
            closes[0] += 1
        return ok

    setattr(pool, "return_socket", return_socket)  # noqa: B010 - an instance's method replaced
    setattr(pool, "_is_socket_alive", is_alive)  # noqa: B010
    setattr(http, "loadgen_closes", closes)  # noqa: B010


def closed_after_answer(http: HTTPClient) -> int:
    """How many kept connections the server closed right after their answer (``open_client``'s)."""
    return int(getattr(http, "loadgen_closes", [0])[0])


def fetch_model(http: HTTPClient, url: URL, headers: dict[str, str], *, total_s: float = SIDE_CALL_S,
                max_bytes: int = PAGE_MAX_BYTES) -> str:
    """The first model the server lists (``target.model: auto``), read within ``total_s`` and
    ``max_bytes``: a server that never answers, or answers without end, holds no user."""
    body = bytearray()
    shown = redact_url(str(url))  # what errors show: no user or password
    try:
        with gevent.Timeout(total_s, LoadgenError(f"{shown}: no full answer within {total_s:g} s; check --host")):
            resp = http.get(url.request_uri, headers=headers)
            while chunk := resp.read(65536):
                body += chunk
                if len(body) > max_bytes:
                    resp.release()
                    raise LoadgenError(f"{shown}: the model list is over {max_bytes >> 20} MiB; "
                                       "is --host the server's /v1 base URL?")
    except (OSError, HTTPConnectionClosed, HTTPParseError) as exc:
        raise LoadgenError(f"{shown}: cannot reach the server ({exc}); check --host") from exc
    if resp.status_code >= 400:
        raise LoadgenError(f"{shown}: HTTP {resp.status_code}; is --host the server's /v1 base URL?")
    try:
        models = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise LoadgenError(f"{shown}: not an OpenAI /models answer; is --host the /v1 base URL?") from exc
    return pick_model(models, "auto", shown)


def stream_request(
    http: HTTPClient, path: str, body: bytes, headers: dict[str, str], t: Timeouts, st: StreamState
) -> tuple[FailureClass | None, str | None, int]:
    """Send one streaming request and read it to the end into ``st``; never raises for a
    failed request; returns the failure (or None, None) and the bytes of the response body
    read. A ``gevent.GreenletExit`` (Locust stopping the user) propagates with ``st`` filled
    so far.
    """
    # the request's total bound is the one ``st`` holds (the scenario's, or the default one)
    total_s = st.total_limit_ns / 1e9 if st.total_limit_ns is not None else None
    limits = [x for x in (t.first_token_s, total_s) if x is not None]
    timer = gevent.Timeout(min(limits)) if limits else None
    resp = None
    now = time.perf_counter_ns
    error: FailureClass | None = None
    detail: str | None = None
    received = 0
    idle_ns = int(t.between_tokens_s * 1e9) if t.between_tokens_s is not None else None
    if timer is not None:
        timer.start()
    try:
        st.sent_ns = now()
        try:
            resp = http.request("POST", path, body=body, headers=headers)
        except (HTTPConnectionClosed, ConnectionResetError, BrokenPipeError):
            # a kept-alive connection the server closed before any byte of the answer: the
            # request never reached it (a POST without an answer is safe to resend). Sent again
            # on a new connection, once; the record keeps the first attempt's time
            st.retries += 1
            resp = http.request("POST", path, body=body, headers=headers)
        stamped = stamped_socket(http)
        if stamped is not None and not st.retries and stamped.sent_ns >= st.sent_ns:
            st.sent_ns = stamped.sent_ns  # the write's time (a request sent again keeps its first)
            if timer is not None and not st.chunk_ns:  # the first-token deadline, from the write
                timer.cancel()
                timer = gevent.Timeout(max(min(limits) - (now() - st.sent_ns) / 1e9, 0.0))
                timer.start()
        st.status = resp.status_code
        if st.status >= 400:
            body_read = resp.read()
            error, detail = "http_status", error_snippet(body_read)
            st.done_ns = now()
            return error, detail, len(body_read)
        readline = resp.readline
        read, read_tokens = -1, 0  # the read the last line came in (its handling time), its tokens
        while True:
            line = readline(b"\n")
            if not line:
                rest = resp.read()  # a last line the server did not end with LF
                received += len(rest)
                if rest:
                    st.feed(rest, now())
                break
            received += len(line)
            had_token = bool(st.chunk_ns)
            tokens = len(st.chunk_ns)
            at = now()
            arrived = stamped.arrived_ns if stamped is not None else -1
            if stamped is not None and arrived >= 0:  # the kernel's stamp of the read that brought the line's end
                st.client_delay_ns = max(st.client_delay_ns, stamped.handled_ns - arrived)  # got to it late
                at = max(arrived, st.chunk_ns[-1] if st.chunk_ns else st.sent_ns or 0)
                if read != stamped.handled_ns:
                    read, read_tokens = stamped.handled_ns, 0
            if st.feed(line, at) and st.outcome != (None, None):
                break  # a failure: stop reading (the connection is closed, not reused)
            if STARVE_S and line.strip():  # an event's line, not the blank line that ends it
                end = time.perf_counter() + STARVE_S
                while time.perf_counter() < end:
                    pass
            if arrived >= 0 and len(st.chunk_ns) > tokens:
                read_tokens += 1
                st.coalesced += read_tokens == 2  # a read that carried several tokens: they share its time
            if had_token and idle_ns is not None and at - st.chunk_ns[-1] > idle_ns:
                # bytes keep coming but no token: comments alone do not keep a stream alive
                error, detail = "timeout", f"no token for {t.between_tokens_s:g} s (between_tokens_s)"
                st.done_ns = at
                return error, detail, received
            if not had_token and st.chunk_ns and timer is not None:
                timer.cancel()  # the first token is in: only the total timeout applies now
                timer = None
                if total_s is not None:
                    timer = gevent.Timeout(max(total_s - (now() - st.sent_ns) / 1e9, 0.0))
                    timer.start()
        error, detail = st.end(now())
    except gevent.Timeout as exc:
        if exc is not timer:
            raise
        error, detail = "timeout", "first token" if not st.chunk_ns else "total"
    except TimeoutError as exc:  # the socket's connect or read timeout
        error = "timeout"
        detail = "connect or response headers" if resp is None else f"between tokens ({exc})"
    except (HTTPConnectionClosed, HTTPParseError, ConnectionResetError, BrokenPipeError) as exc:
        error = "reset" if st.status is None else "stream_cut"
        detail = str(exc) or type(exc).__name__
    except OSError as exc:  # refused, unreachable, name not resolved
        error = "connect" if st.status is None else "stream_cut"
        detail = str(exc) or type(exc).__name__
    finally:
        if timer is not None:
            timer.cancel()
        if resp is not None:
            resp.release()
    if st.done_ns is None and error is not None:
        st.done_ns = now()
    return error, detail, received
