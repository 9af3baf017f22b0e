"""The environment failures a command stops on, each with a message naming what failed (the CLI maps them to exit
codes: docs/reference.md, 'Exit codes')."""

from __future__ import annotations


class GameFileError(ValueError):
    """A game a split needs is missing or damaged on disk (its size or sha256 differs from the manifest's)."""


class EnvironmentFailure(RuntimeError):
    """The environments failed so that a step cannot go on (every episode failed: no sample to learn from)."""


SIMULATOR_FAILURE_KINDS = ("timeout", "crash")


class SimulatorFailure(RuntimeError):
    """A call into an environment's own simulator process (ScienceWorld's JVM) that failed: `kind` is 'timeout' (no
    answer within its deadline: the process was killed) or 'crash' (it died, or its connection broke). The slots
    count it by kind (`failed_simulator_<kind>`), apart from the worker pool's own timeouts and crashes."""

    def __init__(self, kind: str, message: str) -> None:
        if kind not in SIMULATOR_FAILURE_KINDS:
            raise ValueError(f"kind must be one of {SIMULATOR_FAILURE_KINDS}, got {kind!r}")
        super().__init__(f"{kind}: {message}")
        self.kind = kind
