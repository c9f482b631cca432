"""Tool definitions for chat requests (``workload.tools``): read once, checked, and the
``tool_choice`` the request carries."""

from __future__ import annotations

from typing import Any

from loadgen.scenario.loader import tool_definitions

__all__ = ["tool_choice", "tool_definitions"]


def tool_choice(choice: str) -> str | dict[str, Any]:
    """``tool_choice`` as the API takes it: a mode, or the function to call."""
    if choice in ("auto", "required", "none"):
        return choice
    return {"type": "function", "function": {"name": choice}}
