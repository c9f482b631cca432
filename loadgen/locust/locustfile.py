"""The locustfile of ``loadgen locust``: the LLM-aware user, ready for plain ``locust -f`` too.

    locust -f "$(loadgen locust --print-locustfile)" --scenario scenarios/chat.yaml \\
        --host http://127.0.0.1:8000/v1

Users and spawn rate come from Locust (-u / -r or the web UI). For the scenario's
concurrency steps as a load shape use ``locustshape.py`` (``loadgen locust --shape``).
"""

from loadgen.locust.user import LLMUser

__all__ = ["LLMUser"]
