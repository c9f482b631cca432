from __future__ import annotations

import loadgen


def test_public_api_is_pinned() -> None:
    assert sorted(loadgen.__all__) == sorted([
        "AbortedError", "Cell", "LaunchError", "LoadgenError", "RequestRecord", "RunDirError",
        "RunResult", "SSEParser", "Scenario", "ScenarioError", "ServerError", "SimConfig",
        "TargetError", "UsageError", "__version__", "build_schedule", "distribution", "execute",
        "expand_cells", "load_scenario", "read_records", "rebuild_summary", "summarize",
    ])
    for name in loadgen.__all__:
        assert hasattr(loadgen, name), name
