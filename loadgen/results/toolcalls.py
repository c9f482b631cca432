"""A cell's tool calls (``workload.tools``): the requests whose answer called a tool, the tokens
the calls took, and the time from the send to a call's first token (its statistics, seconds)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True, slots=True)
class ToolCalls:
    requests: int
    tool_call_tokens_total: int
    time_to_tool_call_s: dict[str, float | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> ToolCalls | None:
        if not isinstance(data, dict):
            return None
        return cls(int(data["requests"]), int(data["tool_call_tokens_total"]), dict(data.get("time_to_tool_call_s")
                                                                                     or {}))
