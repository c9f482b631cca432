"""Which tokenizer counts a dataset's lengths."""

from __future__ import annotations

from loadgen.load.target import token_counter
from loadgen.scenario.loader import parse_scenario
from loadgen.servers.tiny import ensure_tiny


def test_a_catalogue_alias_names_its_tokenizer_and_nothing_falls_back_to_words() -> None:
    from tokenizers import Tokenizer

    path = ensure_tiny()
    count, how = token_counter(parse_scenario({"workload": {"tokenizer": "tiny"}}))
    assert count is not None
    assert str(path) in how
    text = "what is the time now"
    assert count(text) == len(Tokenizer.from_file(str(path / "tokenizer.json")).encode(text).ids)
    words, how = token_counter(parse_scenario({}))
    assert words is None
    assert "in words" in how
