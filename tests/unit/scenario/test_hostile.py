"""Hostile scenario files and --set values: each is one line naming the file and the fix (a
ScenarioError: exit 2), never a traceback, and nothing expands without bound."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen.errors import ScenarioError
from loadgen.scenario.loader import load_scenario

BOMB = "".join(f"{a}: &{a} [{', '.join([f'*{p}'] * 9)}]\n" for p, a in zip("abcdefgh", "bcdefghi", strict=True))

CASES = [
    (b"\x00\x01binary\xff", "not a text file"),
    (b"workload: {num_prompts: 1}\nworkload: {num_prompts: 2}\n", "key 'workload' given twice at line 2: keep one"),
    (b"workload: {num_prompts: true}\n", "workload.num_prompts -> expected a number or text, not true"),
    (b"load: {rate: .nan}\n", "load.rate -> must be a finite number"),
    (b"target: {timeouts: {total_s: .inf}}\n", "target.timeouts.total_s -> must be a finite number"),
    (b"seed: -1\n", "seed -> Input should be greater than or equal to 0"),
    (b"seed: 100000000000000000000000\n", "seed -> Input should be less than 9223372036854775808"),
    (b"target: {base_url: ftp://x/v1}\n", "base_url must start with http:// or https://"),
    (b"target: {base_url: 'http://127.0.0.1:99999/v1'}\n", "the port must be a number from 1 to 65535"),
    (b"target: {base_url: 'http:///v1'}\n", "no host"),
    (b"workload: {num_prompts: 1000000000}\n", "workload.num_prompts -> Input should be less than or equal to 10000000"),
    (b"", "the file is empty"),
    (b"a: &a [x, x, x, x, x, x, x, x, x]\n" + BOMB.encode() + b"target: {headers: *i}\n",
     "the aliases expand to"),
    # a tree, bounded: an anchor holding its own alias, brackets thousands deep, a huge list
    (b"name: s\nload: &l {concurrency: [1, *l]}\n", "an alias at line 2 holds itself: a scenario is a tree"),
    pytest.param(b"name: " + b"[" * 3000 + b"]" * 3000 + b"\n", "nested more than 100 deep", id="3000-deep"),
    pytest.param(b"name: " + b"[" * 150 + b"]" * 150 + b"\n", "nested more than 100 deep at line 1", id="150-deep"),
    pytest.param(b"name: [" + b", ".join(b"1" for _ in range(100_001)) + b"]\n",
                 "the document holds 100,004 values (at most 100,000): a scenario holds a few hundred", id="100k-values"),
]


@pytest.mark.parametrize(("text", "message"), CASES)
def test_hostile_files_are_one_line(tmp_path: Path, text: bytes, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(text)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    line = str(err.value)
    assert line.startswith(str(path))
    assert message in line
    assert "\n" not in line
    assert len(line) < 400  # no value is echoed at length


@pytest.mark.parametrize(("sets", "message"), [
    (["name=[unclosed"], "--set name: the value is not YAML"),
    (["load.concurrency=true"], "load.concurrency -> expected a number or text, not true"),
    (["workload.num_prompts=.inf"], "workload.num_prompts"),
    (["target.headers=" + "x" * 5000], "target.headers"),
])
def test_hostile_set_values_are_one_line(tmp_path: Path, sets: list[str], message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: ok\n")
    with pytest.raises(ScenarioError) as err:
        load_scenario(path, sets)
    assert message in str(err.value)
    assert "\n" not in str(err.value)
    assert len(str(err.value)) < 400


texts = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    st.dictionaries(st.sampled_from(["name", "target", "workload", "load", "seed", "serve", "matrix"]),
                    st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
                                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6),
                                                                                             inner, max_size=3),
                                 max_leaves=10), max_size=5).map(lambda d: yaml.safe_dump(d).encode()),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(texts, st.lists(st.text(max_size=30), max_size=3))
def test_any_file_and_set_values_load_or_explain_in_one_line(tmp_path: Path, text: bytes, sets: list[str]) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(text)
    message = ""
    try:
        load_scenario(path, sets)
    except ScenarioError as exc:  # anything else (a traceback) fails the test
        message = str(exc)
    assert "\n" not in message
