"""Every way a credential can be given ends up redacted wherever it would be written."""

from __future__ import annotations

from loadgen.scenario.loader import parse_scenario
from loadgen.scenario.matrix import expand_cells
from loadgen.scenario.redact import REDACTED, dump_scenario, redact_argv, redact_url


def test_argv_in_every_form() -> None:
    argv = ["loadgen", "run", "--set=target.headers.Authorization=Bearer s3cret", "--set",
            "target.headers={X-Api-Key: s3cret}", "--set", "target.headers.X-Trace=s3cret",
            "--base-url", "http://user:s3cret@127.0.0.1:8000/v1", "--set", "load.concurrency=4"]
    out = redact_argv(argv)
    assert "s3cret" not in " ".join(out)
    assert out[2] == f"--set=target.headers.Authorization={REDACTED}"
    assert out[4] == f"target.headers={REDACTED}"
    assert out[8] == f"http://{REDACTED}@127.0.0.1:8000/v1"
    assert out[-1] == "load.concurrency=4"  # the rest as it was


def test_urls() -> None:
    assert redact_url("https://a:b@h/v1") == f"https://{REDACTED}@h/v1"
    assert redact_url("https://h/v1?x=a@b") == "https://h/v1?x=a@b"  # no user part


def test_scenario_headers_urls_and_header_axes() -> None:
    sc = parse_scenario({
        "target": {"base_url": "http://u:s3cret@h:1/v1", "headers": {"X-Custom": "s3cret"}},
        "matrix": {"target.headers.Authorization": ["Bearer s3cret-a", "Bearer s3cret-b"]},
    })
    text = dump_scenario(sc)
    assert "s3cret" not in text
    assert text.count(REDACTED) >= 4
    cells = expand_cells(sc)
    assert len(cells) == 2
    assert all(c.params()["target.headers.Authorization"] == REDACTED for c in cells)
