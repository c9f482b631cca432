"""Reading a scenario: YAML file -> overrides -> ``serve:`` lists as matrix axes -> ``Scenario``.

Failures become one ``ScenarioError`` whose message names the file, each offending field and
the fix. Whether a model name is known is checked by the launching side
(``loadgen.engines.preflight.check_models``), which owns the engines and the catalogue.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import yaml
from pydantic import ValidationError

from loadgen.data import Unchecked
from loadgen.errors import ScenarioError
from loadgen.scenario.inputs import SCENARIO_MAX_BYTES, TOOLS_MAX_BYTES, not_plain, read_input
from loadgen.scenario.matrix import expand_cells
from loadgen.scenario.overrides import apply_overrides, format_validation_error
from loadgen.scenario.schema import AXES, SERVE_LIST_KEYS, PromptFile, Scenario, Workload
from loadgen.scenario.sessionfile import read_sessions
from loadgen.scenario.shapes import Tools
from loadgen.scenario.yamlread import ScenarioYAMLError, read_yaml


def _serve_lists_to_matrix(data: Unchecked) -> Unchecked:
    """``serve: {model: [a, b]}`` is a matrix axis ``serve.model``, varied before the matrix's own;
    the template the points are made from holds each axis's first value."""
    serve = data.get("serve")
    matrix = data.get("matrix")
    if isinstance(serve, dict):
        lists = {k: v for k, v in serve.items() if k in SERVE_LIST_KEYS and isinstance(v, list)}
        if lists and (matrix is None or isinstance(matrix, dict | list)):
            data = {**data, "serve": {k: v for k, v in serve.items() if k not in lists}}
            blocks = matrix if isinstance(matrix, list) else [matrix or {}]
            blocks = [{**lists, **b} if isinstance(b, dict) else b for b in blocks]
            matrix = data["matrix"] = blocks if isinstance(matrix, list) else blocks[0]
    first_block = matrix[0] if isinstance(matrix, list) and matrix else matrix
    if isinstance(first_block, dict):
        data = copy.deepcopy(data)
        axes = first_block.get("axes")
        for axis, values in (axes if isinstance(axes, dict) else first_block).items():
            if axis in ("exclude", "overrides") or not isinstance(axis, str):
                continue
            first = values[0] if isinstance(values, list) and values else values
            if isinstance(values, list) and not values:
                continue
            apply_overrides(data, [], {AXES.get(axis, axis): first})
    return data


def parse_scenario(
    data: Any, source: str = "<scenario>", overrides: list[str] | None = None
) -> Scenario:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: expected a mapping of keys at the top level")
    data = apply_overrides(data, overrides or [])
    data = _serve_lists_to_matrix(data)
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(format_validation_error(source, exc)) from exc


def load_scenario(path: Path | str, overrides: list[str] | None = None) -> Scenario:
    """Read, override and validate a scenario file; relative prompt files resolve beside it."""
    path = Path(path)
    try:
        text = read_input(path, "scenario file", SCENARIO_MAX_BYTES).decode("utf-8")
    except UnicodeDecodeError:
        raise ScenarioError(f"{path}: not a text file (a scenario is YAML in UTF-8)") from None
    try:
        data = read_yaml(text)
    except ScenarioYAMLError as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ScenarioError(f"{path}: not valid YAML{where}") from exc
    if data is None:
        raise ScenarioError(f"{path}: the file is empty; a scenario needs at least target.base_url or serve:")
    scenario = parse_scenario(data, str(path), overrides)
    scenario = scenario.model_copy(update={"workload": resolve_files(scenario.workload, path)})
    expand_cells(scenario, source=str(path))  # a matrix point that is not valid fails here, not mid-run
    return scenario


def _beside(file: Path, scenario_path: Path, field: str, what: str) -> Path:
    resolved = file if file.is_absolute() else scenario_path.parent / file
    if resolved.exists() and (why := not_plain(resolved)) is not None:
        raise ScenarioError(f"{scenario_path}: {field} -> {resolved}: {why}")
    if not resolved.is_file():
        raise ScenarioError(
            f"{scenario_path}: {field} -> no such file {str(resolved)!r}; "
            f"give {what} (a path relative to the scenario file)"
        )
    return resolved


def resolve_files(w: Workload, path: Path) -> Workload:
    """The workload with every file it names resolved beside the scenario file, each checked
    to exist before anything is started."""
    update: dict[str, object] = {}
    if isinstance(w.prompt, PromptFile):
        update["prompt"] = PromptFile(file=_beside(w.prompt.file, path, "workload.prompt.file", "a JSONL file"))
    if w.dataset is not None and w.dataset.path is not None:
        local = w.dataset.path if w.dataset.path.is_absolute() else path.parent / w.dataset.path
        if w.dataset.kind == "hf":
            if local.is_dir():
                update["dataset"] = w.dataset.model_copy(update={"path": local})
        else:
            update["dataset"] = w.dataset.model_copy(update={
                "path": _beside(w.dataset.path, path, "workload.dataset.path", f"the {w.dataset.kind} file")})
    if w.images is not None and w.images.directory is not None:
        found = w.images.directory if w.images.directory.is_absolute() else path.parent / w.images.directory
        if not found.is_dir():
            raise ScenarioError(f"{path}: workload.images.directory -> no such directory: {found}")
        update["images"] = w.images.model_copy(update={"directory": found})
    if w.tools is not None and w.tools.file is not None:
        update["tools"] = w.tools.model_copy(update={
            "file": _beside(w.tools.file, path, "workload.tools.file", "a JSON array of tool definitions")})
        tool_definitions(update["tools"])  # type: ignore[arg-type]  # checked before anything starts
    if w.multi_turn is not None and w.multi_turn.file is not None:
        update["multi_turn"] = w.multi_turn.model_copy(update={
            "file": _beside(w.multi_turn.file, path, "workload.multi_turn.file", "a JSONL file of sessions")})
        tools = update.get("tools", w.tools)
        functions = frozenset(t["function"]["name"] for t in tool_definitions(tools)) if tools else frozenset()  # type: ignore[arg-type]
        read_sessions(update["multi_turn"].file, functions)  # type: ignore[attr-defined]  # checked before anything starts
    if w.trace is not None:
        update["trace"] = w.trace.model_copy(update={
            "file": _beside(w.trace.file, path, "workload.trace.file", "a JSONL trace")})
    for key in ("input_dist", "output_dist"):
        dist = getattr(w, key)
        if dist.file is not None:
            update[key] = dist.model_copy(update={
                "file": _beside(dist.file, path, f"workload.{key}.file", "a CSV of length,weight rows")})
    return w.model_copy(update=update) if update else w


def tool_definitions(tools: Tools) -> tuple[dict[str, Any], ...]:
    """The tools array: the file's (a JSON array) or the inline one, each entry checked to be a
    function with a name; ``ScenarioError`` naming the file and the entry otherwise."""
    where = f"{tools.file}" if tools.file is not None else "workload.tools.definitions"
    if tools.file is not None:
        try:  # (OpenAI's API takes 128 tools: a few hundred kB)
            found = orjson.loads(read_input(tools.file, "tools file", TOOLS_MAX_BYTES))
        except orjson.JSONDecodeError as exc:
            raise ScenarioError(f"{where}: not a JSON array of tool definitions ({exc})") from None
    else:
        found = list(tools.definitions)
    if not isinstance(found, list) or not found:
        raise ScenarioError(f"{where}: give a non-empty JSON array of tool definitions")
    for i, tool in enumerate(found):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict) \
                or not isinstance(function.get("name"), str):
            raise ScenarioError(f"{where}: entry {i + 1} is not {{type: function, function: {{name: ..., "
                                "parameters: ...}}}}")
    names = {t["function"]["name"] for t in found}
    if tools.choice not in ("auto", "required", "none") and tools.choice not in names:
        raise ScenarioError(f"workload.tools.choice {tools.choice!r}: auto, required, none or one of the "
                            f"functions ({', '.join(sorted(names))})")
    return tuple(found)
