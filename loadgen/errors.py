"""loadgen's exceptions, one tree, each class with the exit code the CLI gives it.

    LoadgenError                  exit 1: anything loadgen raises on purpose
    ├── OutputError               a run directory's file could not be written (disk full,
    │                             read-only, no permission, a link planted in its place)
    ├── UsageError                exit 2: bad input from the user
    │   ├── ScenarioError         a scenario file (or --set) that does not validate
    │   └── RunDirError           a run directory that is missing or unreadable
    ├── ServerError               exit 3: the server under test could not be used
    │   ├── LaunchError           a server loadgen launched did not become ready
    │   │   └── EngineUnavailable not installed here, or needs hardware this machine lacks
    │   └── TargetError           a given server is unreachable or not OpenAI-compatible
    └── AbortedError              exit 4: an abort rule ended the run early

During a load run, HTTP and network failures are never exceptions: they are stored on the
request's record with a failure class (see ``loadgen.results.records.FailureClass``).
"""

from __future__ import annotations


class LoadgenError(Exception):
    """Base of every error loadgen raises on purpose; ``str(err)`` is one readable line."""

    exit_code = 1


class OutputError(LoadgenError):
    """A file of a run directory could not be written: the message names it and the OS error."""


class UsageError(LoadgenError):
    exit_code = 2


class ScenarioError(UsageError):
    """A scenario that does not validate: the message names the file and each field."""


class RunDirError(UsageError):
    pass


class ServerError(LoadgenError):
    exit_code = 3


class LaunchError(ServerError):
    """A launched server crashed or missed its readiness deadline; carries its log tail."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


class EngineUnavailable(LaunchError):
    """The engine cannot run here at all (not installed, no GPU): a matrix may skip it."""


class TargetError(ServerError):
    pass


class AbortedError(LoadgenError):
    exit_code = 4


class Interrupted(LoadgenError):
    """SIGINT or SIGTERM before measuring began (e.g. while an engine was starting)."""

    exit_code = 130
