"""The environment protocol every agent loop talks to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class Observation:
    """What the agent sees before choosing its next action."""

    text: str
    task: str
    admissible_actions: list[str] = field(default_factory=list)


@runtime_checkable
class Environment(Protocol):
    """One episode at a time: `reset()` starts it, `step()` advances it until `done`.

    `step` returns `(observation, reward, done, info)`; `info` holds at least `won` (the task is solved)
    and `valid` (the action was one of the admissible actions of the previous observation).
    Reward is 1.0 on a win and 0.0 otherwise; penalties for invalid actions belong to the trainer.
    """

    def reset(self) -> Observation: ...

    def step(self, action: str) -> tuple[Observation, float, bool, dict[str, Any]]: ...

    def close(self) -> None: ...


def normalize_action(action: str) -> str:
    """Case- and whitespace-insensitive form used to compare an action with the admissible ones."""
    return " ".join(action.split()).lower()


def check_step(game_id: str, action: object, *, started: bool, done: bool) -> None:
    """What every environment's step() refuses: an action that is not a str, a step before reset(), a step after
    the episode ended (each one error naming the game)."""
    if not isinstance(action, str):
        raise TypeError(f"action must be a str, got {type(action).__name__}")
    if not started:
        raise RuntimeError(f"{game_id}: call reset() before step()")
    if done:
        raise RuntimeError(f"{game_id}: the episode is over; call reset()")
