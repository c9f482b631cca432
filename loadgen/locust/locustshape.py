"""The locustfile of ``loadgen locust --shape``: the LLM user driven by the scenario's
concurrency sweep, one step of users per ``load.concurrency`` value, each step one cell of
the run directory.
"""

from loadgen.locust.user import LLMUser, ScenarioSteps

__all__ = ["LLMUser", "ScenarioSteps"]
