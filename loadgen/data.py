"""The data whose keys loadgen does not fix, each kind named once, with why its keys are open.

Everything else a run passes around or writes has a type; these stay mappings because their
keys belong to someone else: a file or peer not yet checked, a server, a user's scenario.
"""

from __future__ import annotations

from typing import Any

# a JSON or YAML object as read (a run directory's file, a scenario document, a Locust peer's
# message), before the type that reads it has checked its keys and values
Unchecked = dict[str, Any]

# a request's JSON body: any field an OpenAI-compatible server takes, a scenario's
# ``extra_body`` included, sent or received as it stands
RequestBody = dict[str, Any]

# a matrix point's value on each axis: the axes, and their values, are the scenario's
Labels = dict[str, Any]
