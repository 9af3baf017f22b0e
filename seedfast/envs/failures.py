"""The environment failures a command stops on, each with a message naming what failed (the CLI maps them to exit
codes: docs/reference.md, 'Exit codes')."""

from __future__ import annotations


class GameFileError(ValueError):
    """A game a split needs is missing or damaged on disk (its size or sha256 differs from the manifest's)."""


class EnvironmentFailure(RuntimeError):
    """The environments failed so that a step cannot go on (every episode failed: no sample to learn from)."""
