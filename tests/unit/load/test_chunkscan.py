"""The compiled chunk reading (``loadgen/load/_chunkscan.c``) against the Python one: whatever
the compiled reading answers must be what the Python reading answers, and everything else it
must pass on to it; the chunks servers send a token at a time must be the ones it answers."""

from __future__ import annotations

import errno
import json
import os
import re
import select
import shutil
import socket
import struct
import sysconfig
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.load import sse
from loadgen.load.sse import MalformedChunk, read_chunk
from loadgen.load.stamped import SO_TIMESTAMPNS

COMPILER = shutil.which(os.environ.get("CC", "cc")) is not None
HEADERS = (Path(sysconfig.get_paths()["include"]) / "Python.h").exists()

needs_compiled = pytest.mark.skipif(sse.CHUNK_READER != "compiled" and not (COMPILER and HEADERS),
                                    reason="no C compiler or Python headers here: the Python reading runs alone")


def outcome(reading, data: bytes) -> tuple:
    try:
        chunk = reading(data)
    except MalformedChunk as exc:  # (the same failure, class and words, is what is compared)
        return "raised", type(exc).__name__, str(exc)
    return "chunk", type(chunk).__name__, tuple(chunk)


def scan(data: bytes):
    from loadgen.load import _chunkscan

    return _chunkscan.scan(data)


@needs_compiled
def test_the_compiled_reading_is_built_where_a_compiler_is() -> None:
    # (built at install by `pip install -e .`; optional, so a failed build would go unnoticed)
    assert sse.CHUNK_READER == "compiled", "reinstall loadgen (`pip install -e .`): the C reading was not built"
    # a checkout's C file edited since the build: the tests would run the old code
    assert sse.COMPILED is not None
    assert sse.COMPILED.__file__ is not None
    built, source = Path(sse.COMPILED.__file__), Path(sse.__file__).with_name("_chunkscan.c")
    assert not source.exists() or source.stat().st_mtime <= built.stat().st_mtime, \
        f"{source} changed after {built.name} was built: reinstall loadgen (`pip install -e .`)"


# what servers send a token at a time, as they write it (field order and extras included)
COMMON = [
    # vLLM completions with usage on every chunk (continuous usage stats)
    b'{"id":"cmpl-7","object":"text_completion","created":1732000000,"model":"m","choices":[{"index":0,"text":" the",'
    b'"logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":{"prompt_tokens":128,"total_tokens":131,'
    b'"completion_tokens":3,"prompt_tokens_details":null}}',
    # vLLM chat: the role's first chunk, a token, the last with its reason, the usage-only chunk
    b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}',
    b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    b'"delta":{"content":" caf\xc3\xa9 \\u2014 \\"ok\\"\\n"},"logprobs":null,"finish_reason":null}]}',
    b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    b'"delta":{"content":""},"logprobs":null,"finish_reason":"length","stop_reason":null}]}',
    b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":9,"total_tokens":11,"completion_tokens":2,'
    b'"prompt_tokens_details":{"cached_tokens":8}}}',
    # llama.cpp's server: a token, then the end with its usage and timings
    b'{"choices":[{"finish_reason":null,"index":0,"delta":{"content":" hi"}}],"created":1,"id":"chatcmpl-x",'
    b'"model":"gpt-3.5-turbo","system_fingerprint":"b1-abc","object":"chat.completion.chunk"}',
    b'{"choices":[{"finish_reason":"length","index":0,"delta":{}}],"created":1,"id":"chatcmpl-x","model":"m",'
    b'"object":"chat.completion.chunk","usage":{"completion_tokens":16,"prompt_tokens":5,"total_tokens":21},'
    b'"timings":{"prompt_n":5,"prompt_ms":1.5,"prompt_per_token_ms":0.3,"predicted_per_second":1.2e2}}',
    # text-generation-inference
    b'{"object":"chat.completion.chunk","id":"","created":1,"model":"m","system_fingerprint":"3.0.0-native",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":"\\ud83d\\ude00"},"logprobs":null,'
    b'"finish_reason":null}],"usage":null}',
    # pretty-printed, in another order
    b'{\n  "usage": {"completion_tokens": 1},\n  "choices": [ { "finish_reason": null, "text": "x" } ]\n}',
]


@needs_compiled
@pytest.mark.parametrize("data", COMMON)
def test_what_servers_send_is_read_in_compiled_code_as_python_reads_it(data: bytes) -> None:
    chunk = scan(data)
    assert chunk is not None, "the compiled reading passed on a common chunk"
    assert outcome(lambda d: chunk, data) == outcome(read_chunk, data)
    assert outcome(sse.parse_chunk, data) == outcome(read_chunk, data)


PASSED_ON = [
    b'{"type":"response.output_text.delta","delta":" hello"}',  # the Responses API
    b'{"error":{"message":"out of memory"}}',
    b'{"object":"error","message":"bad"}',
    b'{"choices":[{"delta":{"reasoning_content":"hmm"}}]}',
    b'{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{"}}]}}]}',
    b'{"choices":[{"text":" a"}],"usage":{"completion_tokens":-1}}',  # impossible usage
    b'{"choices":[{"text":" a"}],"usage":{"completion_tokens":2.0}}',
    b'{"choices":[{"text":5}]}',  # text that is no text
    b'{"choices":[{"text":" a"}]',  # cut short
    b'{"choices":[{"text":" a"}]}x',
    b'{"model":"mod\xc3\xa8le","choices":[]}',  # non-ASCII outside the text
    b'{"choices":[{"text":"\\ud800"}]}',  # a lone surrogate
    b'{"choices":[{"text":"\xff"}]}',  # not UTF-8
    b'{"choices":[{"text":"a","text":"b"}]}',  # a field twice
    b'{"id":"x"}',  # neither choices nor usage
    b'{"choices":null}',
    b'{"model":"\\udc00","choices":[]}',  # a lone surrogate where nothing is read
    b'{"created":1e400,"choices":[]}',  # past a double's range
    b'{"choices":[{"delta":{"content":"a"},"text":"\x80"}]}',  # not UTF-8 where nothing is read
    b'[]',
    b'',
]


@needs_compiled
@pytest.mark.parametrize("data", PASSED_ON)
def test_what_it_does_not_know_for_certain_goes_to_the_python_reading(data: bytes) -> None:
    assert scan(data) is None
    assert outcome(sse.parse_chunk, data) == outcome(read_chunk, data)


# (mostly ASCII, as servers' ids and names are: the compiled reading passes on other bytes outside the text)
words = st.text(st.characters(max_codepoint=0x7F), max_size=8) | st.text(max_size=4)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | words,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(words, inner, max_size=3),
    max_leaves=6,
)
counts = st.one_of(st.integers(0, 5000), st.integers(0, 5000), st.none(), st.integers(-3, 2**31), st.floats(0, 10),
                   st.booleans(), st.text(max_size=2))
texts = st.one_of(st.text(), st.text(), st.none(), st.integers(0, 9), st.just(""))


def rarely(draw: st.DrawFn, one_in: int) -> bool:
    # (hypothesis draws an end of a range far more often than its middle: a middle value is rare)
    return draw(st.integers(0, one_in - 1)) == one_in // 2


@st.composite
def chunks(draw: st.DrawFn) -> bytes:
    obj: dict = {}
    keys = ["id", "object", "created", "model", "choices", "usage", "extra", "type", "error"]
    for key in draw(st.permutations(keys)):
        if key == "choices" and draw(st.integers(0, 9)):
            choice: dict = {}
            if draw(st.booleans()):
                delta: dict = {} if draw(st.integers(0, 5)) else None  # type: ignore[assignment]
                if delta is not None:
                    if draw(st.integers(0, 5)):
                        delta["content"] = draw(texts)
                    if draw(st.booleans()):
                        delta["role"] = "assistant"
                    if rarely(draw, 20):
                        delta[draw(st.sampled_from(["reasoning_content", "reasoning", "tool_calls"]))] = draw(texts)
                choice["delta"] = delta
            if draw(st.integers(0, 3)):
                choice["text"] = draw(texts)
            if draw(st.integers(0, 3)):
                choice["finish_reason"] = draw(st.one_of(st.none(), st.sampled_from(["stop", "length"]), texts))
            choice.update(draw(st.dictionaries(st.sampled_from(["index", "logprobs", "x"]), json_values, max_size=2)))
            more = draw(st.lists(json_values, max_size=2))
            obj["choices"] = draw(st.sampled_from([[choice, *more], [], None, [more], choice]))
        elif key == "usage" and draw(st.integers(0, 3)):
            usage: dict = {}
            for field in ("completion_tokens", "prompt_tokens", "total_tokens"):
                if draw(st.integers(0, 4)):
                    usage[field] = draw(counts)
            if draw(st.booleans()):
                usage["prompt_tokens_details"] = draw(st.one_of(
                    st.none(), st.fixed_dictionaries({"cached_tokens": st.one_of(counts, st.integers(-(2**80), 2**80))}),
                    json_values))
            obj["usage"] = usage if draw(st.integers(0, 9)) else draw(json_values)
        elif key == "object" and draw(st.booleans()):
            obj["object"] = draw(st.sampled_from(["text_completion", "chat.completion.chunk", "error"]))
        elif key in ("id", "created", "model", "extra") and draw(st.booleans()):
            obj[key] = draw(json_values)
        elif key in ("type", "error") and rarely(draw, 50):
            obj[key] = draw(st.sampled_from(["response.output_text.delta", "x", None]))
    indent = draw(st.sampled_from([None, None, 1]))
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()), indent=indent)
    data = text.encode("utf-8", "surrogatepass")  # (a lone surrogate: bytes that are not UTF-8)
    cut = draw(st.sampled_from([0, 0, 0, 0, 0, 0, 0, 1, 2, 3]))
    if cut == 1 and data:  # mangled: a byte changed, cut off, or one added
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
    elif cut == 2:
        data = data[:draw(st.integers(0, len(data)))]
    elif cut == 3:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b" ", b",", b"\\", b'"', b"}", b"\x00", b"\xc3"])) + data[at:]
    return data


def agrees(data: bytes) -> None:
    expected = outcome(read_chunk, data)
    assert outcome(sse.parse_chunk, data) == expected
    chunk = scan(data)
    if chunk is not None:
        assert expected == ("chunk", "Chunk", tuple(chunk))


@needs_compiled
@settings(max_examples=300, deadline=None)  # the slow tier draws 10,000
@given(chunks())
def test_the_compiled_reading_agrees_with_the_python_one_on_any_chunk(data: bytes) -> None:
    agrees(data)


@needs_compiled
@pytest.mark.slow
@settings(max_examples=10_000, deadline=None)
@given(chunks())
def test_the_compiled_reading_agrees_with_the_python_one_on_ten_thousand_chunks(data: bytes) -> None:
    agrees(data)


@needs_compiled
def test_the_compiled_reading_of_sockets_takes_the_given_ones_each_once_with_its_stamp() -> None:
    # (the kernel clock's poller reads its ready sockets with it: tests/unit/load/test_stamped.py
    # runs the transport on it and on the Python reading)
    from loadgen.load import _chunkscan

    server = socket.create_server(("127.0.0.1", 0))
    ours, peers = [], []
    epoll = select.epoll()
    for _ in range(2):
        sock = socket.create_connection(server.getsockname())
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.setblocking(False)
        epoll.register(sock.fileno(), select.EPOLLIN)
        ours.append(sock)
        peers.append(server.accept()[0])
    a, b = ours
    deadline = time.monotonic() + 5

    def drain(transports: dict[int, str]) -> list[tuple[str, bytes | int, int]]:
        return _chunkscan.drain(epoll.fileno(), time.time_ns() - time.perf_counter_ns(), transports)

    # the kernel stamps received bytes once any socket of the machine asks, a moment after the
    # first one does (a deferred switch, turned off again when the last one closes): until then
    # reads come unstamped (-1), which the transport counts. Wait for the switch.
    while True:
        peers[0].sendall(b".")
        epoll.poll(1.0)
        (probe,) = drain({a.fileno(): "A"})
        if probe[2] >= 0 or time.monotonic() > deadline:
            break
    sent = time.perf_counter_ns()
    peers[0].sendall(b"to a")
    peers[1].sendall(b"to b")
    while len(epoll.poll(0.1)) < 2 and time.monotonic() < deadline:
        pass

    # a socket the dict does not hold is not read: its bytes wait for whoever holds it
    got = drain({a.fileno(): "A"})
    assert [(t, d) for t, d, _ in got] == [("A", b"to a")]
    assert sent - 1_000_000 <= got[0][2] <= time.perf_counter_ns()  # (1 ms: the two clocks' offset read apart)
    assert b.recv(100) == b"to b"
    assert drain({a.fileno(): "A", b.fileno(): "B"}) == []  # nothing left to read
    # the peer's close: empty bytes; a reset: its error number
    peers[0].close()
    peers[1].setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peers[1].close()
    while len(epoll.poll(0.1)) < 2 and time.monotonic() < deadline:
        pass
    got = sorted(drain({a.fileno(): "A", b.fileno(): "B"}))
    assert [(t, d) for t, d, _ in got] == [("A", b""), ("B", errno.ECONNRESET)]
    for sock in (a, b, server):
        sock.close()
    epoll.close()


def test_the_slots_the_compiled_reading_writes_are_the_python_types_slots() -> None:
    """The C source names the StreamState and SSEParser slots it reads and writes; each is a slot
    of that type, the enum counts them, and a renamed slot fails here before any stream does."""
    from loadgen.load.stream import StreamState

    source = (Path(sse.__file__).parent / "_chunkscan.c").read_text()
    for array, enum_count, cls in (("stream_slots", "S_COUNT", StreamState), ("parser_slots", "P_COUNT", sse.SSEParser)):
        body = source.split(f"static const char *{array}[{enum_count}] = {{", 1)[1].split("};", 1)[0]
        names = json.loads("[" + body.replace("\n", " ").rstrip(", ") + "]")
        (enum,) = re.findall(r"enum \{([^}]*\b" + enum_count + r"\b[^}]*)\}", source)
        assert len(names) == len([e for e in enum.split(",") if e.strip()]) - 1  # the count is the last
        assert set(names) <= set(cls.__slots__), set(names) - set(cls.__slots__)
    assert len(names) == 3  # the parser's: _buf, _parts, _data
