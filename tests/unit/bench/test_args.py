"""`vllm bench serve` flags -> the scenario loadgen runs."""

from __future__ import annotations

import pytest

from loadgen.bench.args import parse
from loadgen.errors import UsageError
from loadgen.scenario.loader import parse_scenario


def test_vllms_defaults_and_the_random_dataset() -> None:
    b = parse(["--model", "m", "--random-input-len", "512", "--random-output-len", "64",
               "--random-range-ratio", "0.1", "--random-prefix-len", "32"])
    sc = parse_scenario(b.scenario)
    assert b.base_url == "http://127.0.0.1:8000/v1"
    assert sc.seed == 0
    assert sc.workload.num_prompts == 1000
    assert (sc.workload.input_tokens, sc.workload.output_tokens) == ((512,), (64,))
    assert sc.workload.input_dist.kind == "uniform"
    assert sc.workload.input_dist.range_ratio == 0.1
    assert sc.workload.shared_prefix is not None
    assert sc.workload.shared_prefix.tokens == 32
    assert sc.workload.ignore_eos is False  # vLLM sends ignore_eos only with --ignore-eos
    assert sc.workload.min_tokens is False  # and never min_tokens
    assert sc.load.concurrency == (None,)  # unlimited
    assert sc.load.rate == (None,)
    assert sc.load.warmup_requests == 0


def test_chat_sharegpt_rate_ramp_and_goodput() -> None:
    b = parse(["--backend", "openai-chat", "--base-url", "http://h:9", "--endpoint", "/v1/chat/completions",
               "--dataset-name", "sharegpt", "--dataset-path", "sg.json", "--disable-shuffle",
               "--sharegpt-output-len", "99", "--max-concurrency", "8", "--ramp-up-strategy", "exponential",
               "--ramp-up-start-rps", "2", "--ramp-up-end-rps", "20", "--goodput", "ttft:300", "e2el:900",
               "--extra-body", '{"top_k": 5}', "--header", "X-A=1", "--metadata", "gpu=h100"])
    sc = parse_scenario(b.scenario)
    assert b.base_url == "http://h:9/v1"
    assert sc.target.api == "chat"
    assert sc.target.extra_body == {"top_k": 5}
    assert sc.target.headers == {"X-A": "1"}
    assert sc.workload.dataset is not None
    assert (sc.workload.dataset.shuffle, sc.workload.dataset.output_tokens) == (False, 99)
    assert sc.load.concurrency == (8,)
    assert sc.load.ramp_up is not None
    assert (sc.load.ramp_up.strategy, sc.load.ramp_up.start_rate, sc.load.ramp_up.end_rate) == ("exponential", 2, 20)
    assert sc.slo is not None
    assert (sc.slo.ttft_ms, sc.slo.e2e_ms) == (300, 900)
    assert b.metadata == {"gpu": "h100"}


@pytest.mark.parametrize(("argv", "message"), [
    (["--profile"], "--profile is a vllm bench serve flag that loadgen does not take"),
    (["--no-such-flag"], "--no-such-flag is not a flag it takes"),
    (["--num-prompts", "x"], "invalid int value"),
    (["--dataset-name", "sharegpt"], "--dataset-name sharegpt needs --dataset-path"),
    (["--metadata", "nokey"], "--metadata 'nokey': expected KEY=VALUE"),
    (["--goodput", "itl:5"], "--goodput itl: choose ttft, tpot or e2el"),
    (["--extra-body", "{x"], "--extra-body: not valid JSON"),
    # refused before the benchmark, not after it ran
    (["--metric-percentiles", "50,150"], "--metric-percentiles '50,150': each between 0 and 100"),
    (["--metric-percentiles", "nan"], "--metric-percentiles 'nan': each between 0 and 100"),
    (["--label", "../../../evil"], "--label '../../../evil': it begins the result's file name; give a name without"),
])
def test_bad_flags_are_one_line_before_anything_runs(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as info:
        parse(argv)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_output_len_stands_for_every_datasets_output_length() -> None:
    for name, extra in (("prefix_repetition", []), ("sharegpt", ["--dataset-path", "sg.json"])):
        sc = parse_scenario(parse(["--dataset-name", name, *extra, "--output-len", "42"]).scenario)
        fixed = sc.workload.dataset.output_tokens if sc.workload.dataset else sc.workload.output_tokens[0]
        assert fixed == 42


def test_every_flag_says_what_it_does() -> None:
    from loadgen.bench.args import HELP, parser

    p = parser()
    flags = [a.option_strings[0] for a in p._actions if a.option_strings]
    assert len(flags) >= 60
    assert all(HELP.get(f) for f in flags)
    text = p.format_help()
    assert "--num-prompts NUM_PROMPTS\n" in text or "--num-prompts NUM_PROMPTS  requests to send" in text
    assert "requests to send" in text
    assert text.startswith("usage: loadgen bench serve [vllm bench serve's flags]")
