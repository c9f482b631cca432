"""The engine registry: each engine is declared once, by its own module, and named nowhere else
in the package but the registry."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import loadgen
from loadgen.engines.registry import ENGINES, MODULES, REGISTRY, engine_named
from loadgen.load.sampling import KNOWN
from loadgen.results.samples import COUNTERS, GAUGES, HISTOGRAMS
from loadgen.scenario.serve import ENGINE_SPECIFIC, EngineOptions

PACKAGE = Path(loadgen.__file__).resolve().parent
# loadgen's own engines' server side (the engines themselves, kept apart from the launch side),
# and `bench serve`'s --backend, whose values are vLLM's benchmark client's API names
NOT_COUNTED = {"servers/hfserve.py", "servers/ct2serve.py", "bench/args.py"}


def _package_names(tree: ast.AST) -> set[int]:
    """ids of string constants that are Python package names an engine checks for (tuples
    assigned to ..._NEEDS / ..._IMPORTS), not engine names."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple) and any(
            isinstance(t, ast.Name) and t.id.endswith(("NEEDS", "IMPORTS")) for t in node.targets
        ):
            ids |= {id(e) for e in node.value.elts}
    return ids


def files_naming(engine: str) -> set[str]:
    """The package's files that use an engine's name in code (a string equal to it) or import its
    module (docstrings and comments do not count)."""
    module = f"loadgen.engines.{engine}"
    found = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in NOT_COUNTED:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _package_names(tree)
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            named = (
                isinstance(node, ast.Constant) and node.value in (engine, module) and id(node) not in skip | docstrings
            ) or (
                isinstance(node, ast.ImportFrom) and (
                    node.module == module or (node.module == "loadgen.engines" and any(a.name == engine for a in node.names))
                )
            )
            if named:
                found.add(rel)
                break
    return found


def test_the_check_finds_what_it_should() -> None:
    assert files_naming("vllm") == {"engines/vllm.py", "engines/registry.py"}
    assert files_naming("no-such-engine") == set()


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_an_engine_is_named_in_at_most_two_files(name: str) -> None:
    assert files_naming(name) == {f"engines/{name}.py", "engines/registry.py"}


def test_every_module_declares_one_engine_named_as_its_module() -> None:
    assert [m.rsplit(".", 1)[1] for m in MODULES] == [e.name for e in ENGINES]
    assert len({n for e in ENGINES for n in e.names}) == sum(len(e.names) for e in ENGINES)


def test_engine_options_are_declared_fields_and_metrics_known_names() -> None:
    for engine in ENGINES:
        assert set(engine.options) <= set(ENGINE_SPECIFIC) <= set(EngineOptions.model_fields), engine.name
        assert set(engine.metrics) <= {*GAUGES, *COUNTERS, *HISTOGRAMS}, engine.name
    # every engine's names are read, after loadgen's own
    assert KNOWN.names["running"][:2] == ("loadgen_sim_requests_running", "vllm:num_requests_running")
    assert "sglang:num_running_reqs" in KNOWN.names["running"]


def test_names_users_write() -> None:
    assert engine_named("llama.cpp") is REGISTRY["llamacpp"]
    assert engine_named("vLLM") is REGISTRY["vllm"]
    assert engine_named(None) is REGISTRY["vllm"]
