"""Scenario YAML, read strictly: a key given twice is an error (YAML would keep the last one
silently), and anchors may be reused only so often (a document of nested aliases expands to
gigabytes: the "billion laughs")."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

MAX_ALIASES = 100
# values in the document once every alias is expanded (a scenario holds a few hundred)
MAX_VALUES = 100_000


class ScenarioYAMLError(ValueError):
    """Why the text is not a scenario document, in one line."""


class _StrictLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise ScenarioYAMLError(f"more than {MAX_ALIASES} aliases (*name) at line {mark.line + 1}: "
                                        "write the values out")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ScenarioYAMLError(f"key {key!r} given twice at line {key_node.start_mark.line + 1}: keep one")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _expanded(node: Node, memo: dict[int, int]) -> int:
    """How many values the node stands for with its aliases expanded (shared nodes counted once each)."""
    if id(node) in memo:
        return memo[id(node)]
    size = 1
    if isinstance(node, SequenceNode):
        size += sum(_expanded(n, memo) for n in node.value)
    elif isinstance(node, MappingNode):
        size += sum(_expanded(k, memo) + _expanded(v, memo) for k, v in node.value)
    memo[id(node)] = size
    return size


def read_yaml(text: str) -> Any:
    """The document, or ``ScenarioYAMLError`` saying where and why (``yaml.YAMLError`` for syntax)."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if (size := _expanded(node, {})) > MAX_VALUES:
            raise ScenarioYAMLError(f"the aliases expand to {size:,} values (at most {MAX_VALUES:,}): write it out")
        return loader.construct_document(node)
    finally:
        loader.dispose()
