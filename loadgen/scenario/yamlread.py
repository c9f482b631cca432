"""Scenario YAML, read strictly: a key given twice is an error (YAML would keep the last one
silently), anchors may be reused only so often (a document of nested aliases expands to
gigabytes: the "billion laughs"), and a document is a tree of bounded depth (an anchor that
holds its own alias, or thousands of nested brackets, is refused in a line)."""

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
        self.aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
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


MAX_DEPTH = 100  # nesting of lists and mappings (a scenario goes a few levels deep)


def _expanded(root: Node) -> int:
    """How many values the node stands for with its aliases expanded (shared nodes counted once
    each), walked without recursion; a node that holds itself, or nesting past ``MAX_DEPTH``,
    is refused."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()  # nodes whose children are being counted: met again, a cycle
    stack: list[tuple[Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        if done:
            children = _children(node)
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in children)
            open_.discard(id(node))
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_:
            raise ScenarioYAMLError(f"an alias at line {node.start_mark.line + 1} holds itself: a scenario is a tree")
        if depth > MAX_DEPTH:
            raise ScenarioYAMLError(f"nested more than {MAX_DEPTH} deep at line {node.start_mark.line + 1}")
        open_.add(id(node))
        stack.append((node, depth, True))
        stack.extend((c, depth + 1, False) for c in _children(node))
    return sizes[id(root)]


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def read_yaml(text: str) -> Any:
    """The document, or ``ScenarioYAMLError`` saying where and why (``yaml.YAMLError`` for syntax)."""
    loader = _StrictLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:  # (PyYAML composes nested nodes recursively)
            raise ScenarioYAMLError(f"nested more than {MAX_DEPTH} deep") from None
        if node is None:
            return None
        if (size := _expanded(node)) > MAX_VALUES:
            what = "the aliases expand to" if loader.aliases else "the document holds"
            raise ScenarioYAMLError(f"{what} {size:,} values (at most {MAX_VALUES:,}): "
                                    + ("write it out" if loader.aliases else "a scenario holds a few hundred"))
        return loader.construct_document(node)
    finally:
        loader.dispose()
