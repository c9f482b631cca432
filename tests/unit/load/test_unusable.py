"""Why a server cannot serve a scenario, from its warmup answers: the hint follows what the
server said (a 404 that names the model is the model, not the base URL)."""

from __future__ import annotations

from loadgen.load.target import unusable
from loadgen.results.records import RequestRecord


def refused(status: int, detail: str) -> RequestRecord:
    return RequestRecord(0, 0, True, 0.0, 0.0, None, None, 0.1, 8, 4, None, 0, "usage", 0, status=status,
                         error="http_status", error_detail=detail)


def test_a_404_naming_the_model_says_the_model() -> None:
    vllm = '{"object":"error","message":"The model `tiny` does not exist.","type":"NotFoundError","param":"model","code":404}'
    said = unusable([refused(404, vllm)], "chat")
    assert said is not None
    assert said.startswith("POST /chat/completions: HTTP 404: ")
    assert said.endswith("the server does not serve that model: set target.model (--model) to an id its "
                         "/v1/models lists, or to auto")


def test_a_404_of_the_path_asks_for_the_base_url() -> None:
    said = unusable([refused(404, '{"detail":"Not Found"}')], "completions")
    assert said is not None
    assert said.endswith("does the server serve /completions under this base URL (usually .../v1)?")
