"""vLLM's rules for a completion request, as loadgen's own servers apply them."""

from __future__ import annotations

import orjson
import pytest

from loadgen.servers.openai.rules import COMPLETIONS_DEFAULT_TOKENS, Ask, RequestRefused, ask_of, request_id, stop_at


def ask(body: dict[str, object], chat: bool = False, prompt: int = 10, context: int = 4096) -> Ask:
    return ask_of(body, chat=chat, served="m", prompt_tokens=prompt, max_model_len=context)


def test_lengths_as_vllm_reads_them() -> None:
    assert ask({"model": "m", "max_tokens": 5}).max_tokens == 5
    assert ask({}).max_tokens == COMPLETIONS_DEFAULT_TOKENS  # completions without a length
    assert ask({}, chat=True, prompt=96).max_tokens == 4000  # chat: to the end of the context
    assert ask({"max_completion_tokens": 7, "max_tokens": 9}, chat=True).max_tokens == 7


@pytest.mark.parametrize(("body", "code", "param", "says"), [
    ({"model": "other"}, 404, "model", "The model `other` does not exist."),
    ({"max_tokens": 0}, 400, "max_tokens", "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"),
    ({"max_tokens": 5000}, 400, "max_tokens", "max_tokens=5000 cannot be greater than max_model_len=4096."),
    ({"max_tokens": 4090}, 400, "max_tokens", "maximum context length is 4096 tokens"),
    ({"n": 0}, 400, "n", "n must be at least 1, got 0."),
    ({"max_tokens": "x"}, 400, "max_tokens", "max_tokens must be an integer"),
])
def test_refusals_carry_vllms_status_type_and_field(body: dict[str, object], code: int, param: str, says: str) -> None:
    with pytest.raises(RequestRefused) as caught:
        ask(body)
    assert caught.value.code == code
    error = orjson.loads(caught.value.body())["error"]
    assert error["code"] == code
    assert error["param"] == param
    assert error["type"] == ("NotFoundError" if code == 404 else "BadRequestError")
    assert says in error["message"]


def test_choices_stops_echo_and_logprobs() -> None:
    a = ask({"n": 3, "stop": "x", "echo": True, "logprobs": 2})
    assert (a.n, a.stop, a.echo, a.logprobs) == (3, ("x",), True, 2)
    chat = ask({"stop": ["a", "b"], "echo": True, "logprobs": True, "top_logprobs": 4}, chat=True)
    assert (chat.stop, chat.echo, chat.logprobs) == (("a", "b"), False, 4)  # no echo in chat


def test_the_first_stop_string_to_appear_ends_the_answer() -> None:
    words = [" the", " of", " and", " to"]
    assert stop_at(words, ("nd",)) == (3, " the of a")
    assert stop_at(words, ("to", "of")) == (2, " the ")
    assert stop_at(words, ("zz",)) is None
    assert stop_at(words, ()) is None


def test_ids_are_fresh_in_vllms_forms() -> None:
    ids = {request_id(False) for _ in range(100)}
    assert len(ids) == 100
    assert all(i.startswith("cmpl-") for i in ids)
    assert request_id(True).startswith("chatcmpl-")
