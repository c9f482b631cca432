"""A cell's tool calls (``workload.tools``): the requests whose answer called a tool, the tokens
the calls took, the time from the send to a call's first token (its statistics, seconds), and
for a session file's turns how often the answer called what the file expected."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True, slots=True)
class ToolCalls:
    requests: int
    tool_call_tokens_total: int
    time_to_tool_call_s: dict[str, float | None] = field(default_factory=dict)
    # agent sessions from a file: the turns that said which calls to expect, and the share of
    # them whose answer called exactly those functions (None where no turn said)
    expected_turns: int = 0
    as_expected: float | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> ToolCalls | None:
        if not isinstance(data, dict):
            return None
        share = data.get("as_expected")
        return cls(int(data["requests"]), int(data["tool_call_tokens_total"]), dict(data.get("time_to_tool_call_s")
                                                                                     or {}),
                   int(data.get("expected_turns") or 0), None if share is None else float(share))
