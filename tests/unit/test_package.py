"""The package's shape: importing it loads nothing else, and no module imports itself back
through others (imports inside functions count)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import loadgen

PACKAGE = Path(loadgen.__file__).resolve().parent


def test_package_exports_only_its_version() -> None:
    assert loadgen.__all__ == ["__version__"]
    assert loadgen.__version__.count(".") >= 2


def test_import_loads_only_the_package_itself() -> None:
    code = "import loadgen, sys; print(sum(m.startswith('loadgen') for m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(done.stdout) <= 3
    code = "import loadgen, sys; print(sorted(m for m in sys.modules if m.startswith('loadgen')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['loadgen']"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the loadgen modules it imports anywhere in its source (functions included)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A path that returns to its start, or None (depth-first search, three colours)."""
    colour = dict.fromkeys(graph, 0)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if colour[dep] == 1:
                return [*stack[stack.index(dep):], dep]
            if colour[dep] == 0 and (found := visit(dep)) is not None:
                return found
        stack.pop()
        colour[node] = 2
        return None

    for node in sorted(graph):
        if colour[node] == 0 and (found := visit(node)) is not None:
            return found
    return None


def test_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle() -> None:
    graph = import_graph()
    assert "loadgen.cli" in graph
    assert "loadgen.load.run" in graph["loadgen.cli.running"]
    assert find_cycle(graph) is None


def test_no_module_over_500_lines() -> None:
    long = {module_name(p): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}
