"""The simulator answers as vLLM does, checked through OpenAI's SDK against both: the same
assertions run against ``loadgen sim`` and vLLM's CPU build serving the tiny model."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.conftest import StartSim

ROOT = Path(__file__).parents[2]


@pytest.fixture(params=["sim", pytest.param("vllm", marks=pytest.mark.engines)])
def server(request: pytest.FixtureRequest, start_sim: StartSim) -> Iterator[tuple[openai.OpenAI, str]]:
    if request.param == "sim":
        url, model = start_sim(ttft_ms=1, itl_ms=1), "loadgen-sim"
    else:
        url, model = request.getfixturevalue("vllm_engine"), "tiny"
    with openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120) as client:
        yield client, model


def test_an_unknown_model_is_404_not_found(server: tuple[openai.OpenAI, str]) -> None:
    client, _ = server
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="no-such-model", prompt="hello there", max_tokens=2)
    assert caught.value.status_code == 404
    assert "no-such-model" in caught.value.message
    assert caught.value.body["type"] == "NotFoundError"  # type: ignore[index]


def test_max_tokens_zero_is_400_naming_it(server: tuple[openai.OpenAI, str]) -> None:
    client, model = server
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model, prompt="hello there", max_tokens=0)
    assert caught.value.status_code == 400
    assert "max_tokens" in caught.value.message
    assert caught.value.code == 400 or caught.value.code == "400"


# vLLM's checks of the sampling parameters (SamplingParams._verify_args), as an SDK user meets
# them: 400, BadRequestError, the field where vLLM names it, and vLLM's own words
SAMPLING_REFUSALS = [
    ({"temperature": -1}, "temperature", "temperature must be non-negative, got -1.0."),
    ({"temperature": 2.5}, "temperature", "temperature must be in [0, 2], got 2.5."),
    ({"top_p": 0}, "top_p", "top_p must be in (0, 1], got 0.0."),
    ({"presence_penalty": 3}, None, "presence_penalty must be in [-2, 2], got 3.0."),
    ({"frequency_penalty": -2.5}, None, "frequency_penalty must be in [-2, 2], got -2.5."),
    ({"extra_body": {"repetition_penalty": 0}}, None, "repetition_penalty must be greater than zero, got 0.0."),
    ({"extra_body": {"top_k": -2}}, None, "top_k must be 0 (disable), or at least 1, got -2."),
    ({"extra_body": {"min_p": 1.5}}, None, "min_p must be in [0, 1], got 1.5."),
    ({"extra_body": {"min_tokens": 5}}, None, "min_tokens must be less than or equal to max_tokens=2, got 5."),
    ({"stop": [""]}, None, "stop cannot contain an empty string."),
]


@pytest.mark.parametrize(("extra", "param", "says"), SAMPLING_REFUSALS,
                         ids=[next(iter(e.get("extra_body", e))) for e, _, _ in SAMPLING_REFUSALS])
def test_sampling_parameters_out_of_bounds_are_refused_as_vllm_refuses_them(
    server: tuple[openai.OpenAI, str], extra: dict, param: str | None, says: str,
) -> None:
    client, model = server
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model, prompt="hello there", max_tokens=2, **extra)
    assert caught.value.status_code == 400
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["type"] == "BadRequestError"
    assert body["param"] == param
    assert body["message"].startswith(says), body["message"]


def test_ids_are_unique_and_usage_has_prompt_details(server: tuple[openai.OpenAI, str]) -> None:
    client, model = server
    answers = [client.completions.create(model=model, prompt="hello there", max_tokens=2) for _ in range(3)]
    assert len({a.id for a in answers}) == 3
    assert all(a.id.startswith("cmpl-") for a in answers)
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert chat.id.startswith("chatcmpl-")
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 2


def test_n_choices_and_their_usage(server: tuple[openai.OpenAI, str]) -> None:
    client, model = server
    answer = client.completions.create(model=model, prompt="hello there", max_tokens=3, n=2, extra_body={
        "ignore_eos": True})
    assert sorted(c.index for c in answer.choices) == [0, 1]
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 6
    streamed = client.completions.create(model=model, prompt="hello there", max_tokens=3, n=2, stream=True,
                                         extra_body={"ignore_eos": True})
    assert {c.index for chunk in streamed for c in chunk.choices} == {0, 1}


def test_a_stop_string_ends_the_answer_before_it(server: tuple[openai.OpenAI, str]) -> None:
    client, model = server
    full = client.completions.create(model=model, prompt="hello there", max_tokens=12, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = next(ch for ch in full[2:] if ch.strip())  # a character the answer holds after its start
    cut = client.completions.create(model=model, prompt="hello there", max_tokens=12, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True}).choices[0]
    assert cut.finish_reason == "stop"
    assert stop not in cut.text
    assert full.startswith(cut.text)


def test_echo_and_logprobs(server: tuple[openai.OpenAI, str]) -> None:
    client, model = server
    echoed = client.completions.create(model=model, prompt="hello there", max_tokens=2, echo=True,
                                       extra_body={"ignore_eos": True})
    assert echoed.choices[0].text.startswith("hello there")
    with_logprobs = client.completions.create(model=model, prompt="hello there", max_tokens=2, logprobs=1,
                                              extra_body={"ignore_eos": True})
    lp = with_logprobs.choices[0].logprobs
    assert lp is not None
    assert lp.tokens is not None
    assert len(lp.tokens) == 2
    assert lp.token_logprobs is not None
    assert len(lp.token_logprobs) == 2


def test_chat_without_a_length_runs_past_sixteen_tokens(server: tuple[openai.OpenAI, str]) -> None:
    client, model = server
    # no max_tokens: vLLM generates to the context's end (bounded here by a short stream read)
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], stream=True,
                                            extra_body={"ignore_eos": True})
    seen, t0 = 0, time.monotonic()
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            seen += 1
        if seen > 40 or time.monotonic() - t0 > 60:
            break
    stream.close()
    assert seen > 40


def test_the_responses_api_streamed_and_whole(server: tuple[openai.OpenAI, str]) -> None:
    client, model = server
    # vLLM's extras force the length, as loadgen sends them (a server without them ignores them)
    extra = {"ignore_eos": True, "min_tokens": 4}
    whole = client.responses.create(model=model, input="hello there", max_output_tokens=4, extra_body=extra)
    assert whole.status in ("completed", "incomplete")
    assert whole.usage is not None
    assert whole.usage.output_tokens == 4
    assert whole.usage.input_tokens > 0
    kinds: list[str] = []
    with client.responses.stream(model=model, input=[{"role": "user", "content": "hi"}], max_output_tokens=4,
                                 extra_body=extra) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created"
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.delta" in kinds
    assert final.usage is not None
    assert final.usage.output_tokens == 4
    assert final.output_text


def test_structured_output_through_the_sdk(start_sim: StartSim) -> None:
    """The simulator's JSON answers, as OpenAI's SDK parses them (chat's json_schema format)."""
    import json

    with openai.OpenAI(base_url=start_sim(ttft_ms=1, itl_ms=1), api_key="none", max_retries=0) as client:
        schema = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
                  "required": ["city", "population"]}
        chat = client.chat.completions.create(
            model="loadgen-sim", messages=[{"role": "user", "content": "a city"}], max_tokens=6,
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
        )
        answer = json.loads(chat.choices[0].message.content or "")
        assert set(answer) == {"city", "population"}
        assert isinstance(answer["population"], int)
        assert chat.usage is not None
        assert chat.usage.completion_tokens == 6
        streamed = "".join(
            chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
                model="loadgen-sim", messages=[{"role": "user", "content": "a city"}], max_tokens=6, stream=True,
                response_format={"type": "json_object"}) if chunk.choices)
        assert isinstance(json.loads(streamed), dict)


def test_tool_calls_through_the_sdk(start_sim: StartSim) -> None:
    """The simulator's tool calls, whole and streamed, as OpenAI's SDK reads them."""
    import json

    with openai.OpenAI(base_url=start_sim(ttft_ms=1, itl_ms=1), api_key="none", max_retries=0) as client:
        tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
            "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]
        whole = client.chat.completions.create(model="loadgen-sim", messages=[{"role": "user", "content": "find"}],
                                               tools=tools, max_tokens=5)  # type: ignore[arg-type]
        assert whole.choices[0].finish_reason == "tool_calls"
        call = (whole.choices[0].message.tool_calls or [])[0]
        assert call.function.name == "lookup"  # type: ignore[union-attr]
        assert set(json.loads(call.function.arguments)) == {"query"}  # type: ignore[union-attr]
        name = arguments = ""
        for chunk in client.chat.completions.create(model="loadgen-sim", messages=[{"role": "user", "content": "find"}],
                                                    tools=tools, max_tokens=5, stream=True):  # type: ignore[arg-type]
            for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                name += (delta.function.name or "") if delta.function else ""
                arguments += (delta.function.arguments or "") if delta.function else ""
        assert name == "lookup"
        assert set(json.loads(arguments)) == {"query"}


def test_responses_function_calls_and_previous_response_id_through_the_sdk(start_sim: StartSim) -> None:
    """The Responses API's function calls, whole and streamed, and a conversation carried on by
    ``previous_response_id``, as OpenAI's SDK reads them."""
    import json

    with openai.OpenAI(base_url=start_sim(ttft_ms=1, itl_ms=1), api_key="none", max_retries=0) as client:
        tools = [{"type": "function", "name": "lookup", "parameters": {
            "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}]
        first = client.responses.create(model="loadgen-sim", input="find it", tools=tools,  # type: ignore[arg-type]
                                        max_output_tokens=5)
        (call,) = [item for item in first.output if item.type == "function_call"]
        assert call.name == "lookup"
        assert set(json.loads(call.arguments)) == {"query"}
        assert first.usage is not None
        assert first.usage.output_tokens == 5
        with client.responses.stream(model="loadgen-sim", input="find it", tools=tools,  # type: ignore[arg-type]
                                     max_output_tokens=5) as stream:
            kinds = [event.type for event in stream]
            final = stream.get_final_response()
        assert kinds.count("response.function_call_arguments.delta") == 5
        assert kinds.index("response.output_item.added") < kinds.index("response.function_call_arguments.delta")
        (streamed,) = [item for item in final.output if item.type == "function_call"]
        assert set(json.loads(streamed.arguments)) == {"query"}
        # the call's result, sent with only the previous response's id: the server holds the rest
        after = client.responses.create(
            model="loadgen-sim", previous_response_id=first.id, tools=tools,  # type: ignore[arg-type]
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "found"}], max_output_tokens=3)
        assert after.output_text  # text: the tool's result is in
        assert after.usage is not None
        assert after.usage.input_tokens > first.usage.input_tokens
        with pytest.raises(openai.NotFoundError):
            client.responses.create(model="loadgen-sim", previous_response_id="resp_none", input="x", max_output_tokens=2)


def test_embeddings_through_the_sdk(start_sim: StartSim) -> None:
    with openai.OpenAI(base_url=start_sim(ttft_ms=1, itl_ms=1), api_key="none", max_retries=0) as client:
        answer = client.embeddings.create(model="loadgen-sim", input=["one two three", "four five"])
        assert [d.index for d in answer.data] == [0, 1]
        assert len(answer.data[0].embedding) == 8
        assert answer.usage.prompt_tokens == 5
        with pytest.raises(openai.NotFoundError):
            client.embeddings.create(model="another", input="x")
