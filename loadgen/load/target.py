"""What loadgen learns of a target before measuring it, as pure functions over its answers:
the model to ask for (``/v1/models``), its context length, and whether a failed warmup means
the server cannot serve the scenario at all. The asyncio run and the Locust user both use them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from loadgen.engines.catalogue import resolve_model
from loadgen.errors import TargetError, UsageError
from loadgen.results.records import RequestRecord
from loadgen.scenario.matrix import Cell
from loadgen.scenario.schema import Scenario
from loadgen.workload import datasets
from loadgen.workload.payload import ENDPOINTS


def pick_model(models: Any, wanted: str, url: str) -> str:
    """The model to send: ``wanted``, or with ``auto`` the first id of a ``/v1/models`` answer."""
    if wanted != "auto":
        return wanted
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list):
        raise TargetError(f"{url}: not an OpenAI /models answer; is this the server's /v1 base URL?")
    ids = [m["id"] for m in data if isinstance(m, dict) and m.get("id")]
    if not ids:
        raise TargetError(f"{url}: the server lists no model; set target.model")
    return str(ids[0])


def model_context(models: Any, model: str) -> int | None:
    """``max_model_len`` of ``model`` in a ``/v1/models`` answer (vLLM, SGLang, loadgen's engines)."""
    if not isinstance(models, dict):
        return None
    for m in models.get("data", []):
        if isinstance(m, dict) and m.get("id") == model and isinstance(m.get("max_model_len"), int):
            return int(m["max_model_len"])
    return None


def too_long(cell: Cell, context: int) -> str | None:
    if cell.input_tokens + cell.output_tokens <= context:
        return None
    return (
        f"workload.input_tokens + output_tokens = {cell.input_tokens} + {cell.output_tokens} = "
        f"{cell.input_tokens + cell.output_tokens} exceeds the model's context of {context} tokens "
        "(the server's max_model_len); lower them, or serve the model with a longer context (serve.setting)"
    )


def unusable(warmup: list[RequestRecord], api: str) -> str | None:
    """Why the server cannot serve this scenario at all, when every warmup request failed in a
    way that no retry mends (refused, 4xx other than 408/429, not an event stream); else None.
    Busy answers (429, 5xx) and timeouts are left to the measured run to count."""
    done = [r for r in warmup if r.error != "cancelled"]
    if not done or any(r.ok for r in done):
        return None
    r = done[0]
    endpoint = ENDPOINTS[api]
    detail = (r.error_detail or "")[:200]
    if r.error == "connect":
        return f"POST {endpoint}: cannot connect ({detail}); is the server running?"
    if r.error == "malformed":
        return f"POST {endpoint}: the answer is not an OpenAI event stream ({detail}); is this the server's /v1 URL?"
    status = r.status or 0
    if r.error == "http_status" and (400 <= status < 500 or status == 501) and status not in (408, 429):
        hint = {
            404: f"does the server serve {endpoint} under this base URL (usually .../v1)?",
            405: f"the server does not take POST {endpoint}; is this the OpenAI-compatible base URL?",
            501: f"the server does not take POST {endpoint}; is this the OpenAI-compatible base URL?",
            401: "set the API key in the variable target.api_key_env names",
            403: "set the API key in the variable target.api_key_env names",
        }.get(status, "the server refuses these requests")
        if "chat template" in detail.lower():
            hint = "the model has no chat template: use target.api: completions"
        elif status == 404 and re.search(r"model\b.*(does not exist|not found)", detail, re.I | re.S):
            # the server was reached and names the model: the base URL is right, the model is not
            hint = ("the server does not serve that model: set target.model (--model) to an id its /v1/models "
                    "lists, or to auto")
        return f"POST {endpoint}: HTTP {status}: {detail}; {hint}"
    return None


def refused_params(reason: str, flags: dict[str, bool | None]) -> list[str]:
    """The optional request fields (ignore_eos, min_tokens) a refusal names, still being sent."""
    text = reason.lower()
    return [name for name in ("ignore_eos", "min_tokens") if name in text and flags.get(name) is not False]


def token_counter(point: Scenario) -> tuple[datasets.Count | None, str]:
    """What counts a dataset's tokens: ``workload.tokenizer`` (a tokenizer.json, a directory, a
    catalogue alias such as ``tiny`` or a hub id), else the tokenizer of the model the scenario
    launches when it is on this machine, else words (and the answer says which)."""
    w = point.workload
    named = w.tokenizer or (point.serve.model if point.serve is not None else None)
    if named is None:
        return None, "in words (set workload.tokenizer, or --tokenizer, for the model's token counts)"
    try:
        local = Path(resolve_model(named).checkpoint)
    except UsageError:
        local = Path(named)
    if (local / "tokenizer.json").is_file():
        return datasets.load_tokenizer(str(local)), f"with the tokenizer of {named} ({local})"
    if w.tokenizer is not None:
        return datasets.load_tokenizer(w.tokenizer), f"with the tokenizer {w.tokenizer}"
    return None, f"in words ({named}'s tokenizer is not on this machine; set workload.tokenizer)"
