"""Prompts: exact lengths, reproducible from the seed, and no two requests of a run alike."""

from __future__ import annotations

import pickle
from pathlib import Path

import orjson
import pytest

from loadgen.scenario.loader import parse_scenario
from loadgen.scenario.matrix import expand_cells
from loadgen.scenario.schema import Workload
from loadgen.workload.payload import Prompt
from loadgen.workload.prompts import (
    PromptMaker,
    Stream,
    TextCalibration,
    calibration_requests,
    key_digits,
    prepare_requests,
    request_key,
)
from loadgen.workload.words import WORDS

BLOCK = 16  # a prefix cache's block: vLLM's default


def test_key_spelling_is_fixed_width_and_one_to_one() -> None:
    assert key_digits(0, 10) == [0] * 13  # 42 bits need 13 decimal digits
    assert key_digits(request_key(1, Stream.WARMUP, 5), 145) == key_digits((1 << 32) | (1 << 30) | 5, 145)
    spelled = {tuple(key_digits(request_key(c, s, i), len(WORDS))) for c in range(3) for s in Stream for i in range(300)}
    assert len(spelled) == 3 * len(Stream) * 300
    with pytest.raises(ValueError, match="out of range"):
        request_key(1024, Stream.MEASURED, 0)


def test_token_id_prompts_are_exact_and_reproducible() -> None:
    w = Workload(num_prompts=5, token_id_range=(100, 200), prompt="token-ids")
    make = PromptMaker(w, "completions", seed=3)
    a = [make.prompt(37, 0, Stream.MEASURED, i) for i in range(5)]
    assert all(p.token_ids is not None and len(p.token_ids) == 37 for p in a)
    assert all(100 <= t < 200 for p in a for t in p.token_ids or ())
    assert a == [PromptMaker(w, "completions", seed=3).prompt(37, 0, Stream.MEASURED, i) for i in range(5)]
    other = [PromptMaker(w, "completions", seed=4).prompt(37, 0, Stream.MEASURED, i) for i in range(5)]
    # another seed: the same key spelling up front, different content after it
    assert all(x.token_ids[:7] == y.token_ids[:7] and x.token_ids != y.token_ids  # type: ignore[index]
               for x, y in zip(a, other, strict=True))


def test_text_is_the_default_and_follows_the_calibration() -> None:
    w = Workload(num_prompts=2)
    assert w.prompt == "text"
    assert Workload.model_validate({"prompt": "random-tokens"}).prompt == "token-ids"  # the former name
    make = PromptMaker(w, "completions", seed=0, calibration=TextCalibration(overhead=8, per_word=1))
    p = make.prompt(100, 0, Stream.MEASURED, 0)
    assert p.token_ids is None
    assert p.text is not None
    assert len(p.text.split()) == 92
    assert set(p.text.split()) <= set(WORDS)
    # token-ids on the chat API still sends text: chat messages carry text
    chat = PromptMaker(Workload(prompt="token-ids"), "chat", seed=0).prompt(20, 0, Stream.MEASURED, 0)
    assert chat.text is not None


def first_block(body: bytes) -> tuple[object, ...]:
    data = orjson.loads(body)
    if "messages" in data:
        return tuple(data["messages"][0]["content"].split()[:BLOCK])
    prompt = data["prompt"]
    return tuple(prompt[:BLOCK]) if isinstance(prompt, list) else tuple(prompt.split()[:BLOCK])


@pytest.mark.parametrize(("api", "kind"), [("completions", "text"), ("completions", "token-ids"), ("chat", "text")])
def test_no_two_requests_of_a_run_share_their_first_cache_block(api: str, kind: str) -> None:
    """Calibration probes, warmups and measured requests of every cell, their duration-run
    continuation past num_prompts, and what a worker process makes from the pickled pool."""
    sc = parse_scenario({
        "target": {"api": api},
        "workload": {"num_prompts": 40, "input_tokens": [64, 128], "prompt": kind},
        "load": {"concurrency": [1, 4], "warmup_requests": 3},
    })
    cells = expand_cells(sc)
    assert len(cells) == 4
    seed = 12345
    bodies = [body for _, body in calibration_requests(sc, "m", seed, cells[0].index)]
    for cell in cells:
        warm = prepare_requests(cell, "m", TextCalibration(), seed, Stream.WARMUP, count=3)
        pool = prepare_requests(cell, "m", TextCalibration(), seed)
        assert len(pool) == 40
        bodies += [warm[i].body for i in range(3)]
        bodies += [pool[i].body for i in range(80)]  # a duration run asks for more than num_prompts
        worker_copy = pickle.loads(pickle.dumps(pool))
        assert worker_copy[55].body == pool[55].body  # a worker makes the very same request 55
        assert all(warm[i].warmup for i in range(3))
    blocks = [first_block(b) for b in bodies]
    assert len(bodies) == 2 + 4 * (3 + 80)
    assert len(set(blocks)) == len(blocks)


def test_the_same_seed_gives_the_same_prompts_and_lengths_stay_exact() -> None:
    sc = parse_scenario({"workload": {"num_prompts": 5, "input_tokens": 64, "prompt": "token-ids"}})
    (cell,) = expand_cells(sc)
    a = prepare_requests(cell, "m", TextCalibration(), 7)
    b = prepare_requests(cell, "m", TextCalibration(), 7)
    c = prepare_requests(cell, "m", TextCalibration(), 8)
    assert [a[i].body for i in range(5)] == [b[i].body for i in range(5)]
    assert all(a[i].body != c[i].body for i in range(5))
    assert all(len(orjson.loads(a[i].body)["prompt"]) == 64 == a[i].input_tokens for i in range(5))


def test_a_pool_made_a_slice_at_a_time_is_the_pool_made_at_once() -> None:
    import asyncio

    from loadgen.load import cell as cell_module

    (cell,) = expand_cells(parse_scenario({"workload": {"num_prompts": 5000, "input_tokens": 16}}))
    whole = prepare_requests(cell, "m", TextCalibration(), 7)
    assert len(whole.ready) == 5000
    seen: list[tuple[int, int]] = []
    sliced = prepare_requests(cell, "m", TextCalibration(), 7, eager=False)
    assert sliced.ready == []
    asyncio.run(cell_module.make_ahead(sliced, asyncio.Event(), lambda made, total: seen.append((made, total))))
    # slices of 2,000: told after the first and the second, the third ends it
    assert seen == [(2000, 5000), (4000, 5000)]
    assert [r.body for r in sliced.ready] == [r.body for r in whole.ready]
    # a stop heard between slices: no more is made (the window that follows sends nothing)
    stop = asyncio.Event()
    stopped = prepare_requests(cell, "m", TextCalibration(), 7, eager=False)
    asyncio.run(cell_module.make_ahead(stopped, stop, lambda made, total: stop.set()))
    assert len(stopped.ready) == 2000
    assert stopped[4999].body == whole[4999].body  # (what is asked for past them is made then)


def test_a_workers_share_of_a_pool_holds_its_own_requests_only() -> None:
    from loadgen.workload.prompts import PoolShare
    from loadgen.workload.share import Share

    (cell,) = expand_cells(parse_scenario({"workload": {"num_prompts": 10, "input_tokens": 16}}))
    pool = prepare_requests(cell, "m", TextCalibration(), 7)
    shares = [pickle.loads(pickle.dumps(PoolShare(pool, Share((k,), 3)))) for k in range(3)]
    # worker 1 of 3: requests 1, 4, 7 made ahead; 10 and 13 (a duration run's) made when asked
    assert len(shares[1].ready) == 3
    for i in (1, 4, 7, 10, 13):
        assert shares[1][i].body == pool[i].body
    with pytest.raises(IndexError):
        shares[1][2]
    assert all(len(share) == 10 for share in shares)
    # together they hold the pool once (each used to get the whole of it)
    assert sum(len(pickle.dumps(share.ready)) for share in shares) < 1.05 * len(pickle.dumps(pool.ready))


def test_a_worker_makes_its_own_share_and_it_is_the_share_the_parent_would_have_made() -> None:
    from loadgen.workload.prompts import PoolShare
    from loadgen.workload.share import Share

    (cell,) = expand_cells(parse_scenario({"workload": {"num_prompts": 10, "input_tokens": 16}}))
    whole = prepare_requests(cell, "m", TextCalibration(), 7)
    unmade = prepare_requests(cell, "m", TextCalibration(), 7, eager=False)
    share = pickle.loads(pickle.dumps(PoolShare(unmade, Share((1,), 3))))  # sent before any body is made
    assert (share.ready, share.total) == ([], 3)  # requests 1, 4 and 7 of 10
    assert share.make(2) == 1
    assert [r.body for r in share.ready] == [whole[1].body, whole[4].body]
    assert share[7].body == whole[7].body  # (not made ahead yet: made when asked)
    assert share.make(2) == 0
    assert share.make(2) == 0  # nothing past the requests made ahead
    assert [r.body for r in share.ready] == [whole[i].body for i in (1, 4, 7)]
    assert share[10].body == whole[10].body  # a duration run's, past them
    with pytest.raises(IndexError):
        share[3]
    # a pool partly made by the parent: the share goes on from there
    part = prepare_requests(cell, "m", TextCalibration(), 7, eager=False)
    part.make(5)
    rest = PoolShare(part, Share((1,), 3))
    assert (len(rest.ready), rest.make(100)) == (2, 0)
    assert [r.body for r in rest.ready] == [whole[i].body for i in (1, 4, 7)]
    # a share of two requests in each cycle of five (a worker with two streams of five): 0, 3,
    # 5, 8 of 10, the parent having made 0 to 4
    uneven = PoolShare(part, Share((0, 3), 5))
    assert (len(uneven.ready), uneven.total, uneven.make(100)) == (2, 4, 0)
    assert [r.body for r in uneven.ready] == [whole[i].body for i in (0, 3, 5, 8)]
    assert uneven[13].body == whole[13].body
    with pytest.raises(IndexError):
        uneven[4]


def test_prompt_file_lines_are_used_in_turn(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(o) for o in ({"prompt": "hello there"}, {"prompt_token_ids": [1, 2]})))
    sc = parse_scenario({"workload": {"num_prompts": 4, "prompt": {"file": str(path)}}})
    (cell,) = expand_cells(sc)
    pool = prepare_requests(cell, "m", TextCalibration(), 0)
    prompts = [orjson.loads(pool[i].body)["prompt"] for i in range(5)]
    assert prompts == ["hello there", [1, 2], "hello there", [1, 2], "hello there"]
    assert pool[0].input_tokens is None
    chat = tmp_path / "c.jsonl"
    chat.write_bytes(orjson.dumps({"messages": [{"role": "user", "content": "x"}]}))
    sc = parse_scenario({"target": {"api": "chat"}, "workload": {"num_prompts": 2, "prompt": {"file": str(chat)}}})
    (cell,) = expand_cells(sc)
    assert orjson.loads(prepare_requests(cell, "m", TextCalibration(), 0)[1].body)["messages"][0]["content"] == "x"


def test_malformed_token_ids_in_a_prompt_file_are_refused(tmp_path: Path) -> None:
    from loadgen.errors import ScenarioError
    from loadgen.scenario.shapes import Dataset
    from loadgen.workload.datasets import jsonl

    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt_token_ids": [1, "two"]}\n')
    with pytest.raises(ScenarioError, match=r"p.jsonl: line 1: prompt_token_ids must be a non-empty list of token ids"):
        jsonl(Dataset(kind="jsonl", path=path), 10, 0)
    assert isinstance(Prompt(None, text="x"), Prompt)


def test_a_shared_prefix_opens_every_nth_request_and_the_rest_is_its_own() -> None:
    sc = parse_scenario({"workload": {"num_prompts": 6, "input_tokens": 20, "shared_prefix": {"prefixes": 2,
                                                                                                "tokens": 30}}})
    (cell,) = expand_cells(sc)
    pool = prepare_requests(cell, "m", TextCalibration(), 4)
    words = [orjson.loads(pool[i].body)["prompt"].split() for i in range(6)]
    assert all(len(w) == 50 for w in words)
    assert all(pool[i].input_tokens == 50 for i in range(6))
    assert words[0][:30] == words[2][:30] == words[4][:30]
    assert words[1][:30] == words[3][:30]
    assert words[0][:30] != words[1][:30]
    assert len({tuple(w[30:]) for w in words}) == 6  # no two suffixes alike


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_shared_prefix_prompts_are_as_long_as_asked_by_a_real_tokenizer(api: str) -> None:
    """The tiny model's BPE tokenizer splits a prompt's first word (no space before it) as it
    pleases: a prefix opening with the word the request's own text opens with keeps the length
    the calibration measured, for every request, in low cells and a high one."""
    from transformers import AutoTokenizer

    from loadgen.servers.tiny import ensure_tiny

    tok = AutoTokenizer.from_pretrained(str(ensure_tiny()))

    def count(text: str) -> int:
        if api == "chat":
            text = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False)
        return len(tok(text)["input_ids"])

    sc = parse_scenario({"workload": {"num_prompts": 40, "input_tokens": 100,
                                      "shared_prefix": {"prefixes": 4, "tokens": 64}},
                         "target": {"api": api}})
    for cell in (0, 40, 104):
        bodies = calibration_requests(sc, "m", 5, cell)
        field = "prompt" if api == "completions" else "messages"
        texts = [orjson.loads(b)[field] for _, b in bodies]
        points = [(n, count(t if api == "completions" else t[0]["content"])) for (n, _), t in zip(bodies, texts,
                                                                                                 strict=True)]
        per_word = (points[1][1] - points[0][1]) / 32
        maker = PromptMaker(sc.workload, api, 5, TextCalibration(points[0][1] - 16 * per_word, per_word))
        for i in range(40):
            p = maker.prompt(100, cell, Stream.MEASURED, i, i % 4)
            assert p.text is not None
            assert count(p.text) == 164, (cell, i)
