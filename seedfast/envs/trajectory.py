"""A finished (or aborted) episode, as rollout produces it and analyzers and the trainer consume it.

Plain data: every field is a str, number, bool, list or dict, so `to_dict()` goes straight to JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class TrajectoryStep:
    observation: str
    admissible_actions: list[str]
    action: str
    response_ids: list[int] = field(default_factory=list)
    valid: bool = True
    reward: float = 0.0
    response_text: str = ""


@dataclass
class Trajectory:
    task: str
    game_id: str
    steps: list[TrajectoryStep] = field(default_factory=list)
    won: bool = False
    final_observation: str = ""  # what the environment answered to the last action
    error: str | None = None
    walkthrough: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_invalid(self) -> int:
        return sum(not step.valid for step in self.steps)

    @property
    def actions(self) -> list[str]:
        return [step.action for step in self.steps]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["n_invalid"] = self.n_invalid
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        if not isinstance(data, dict):
            raise TypeError(f"trajectory data must be a dict, got {type(data).__name__}")
        missing = [key for key in ("task", "game_id") if key not in data]
        if missing:
            raise ValueError(f"trajectory data lacks key(s) {missing}")
        known = {f.name for f in fields(cls)}
        kwargs = {key: value for key, value in data.items() if key in known}
        step_keys = {f.name for f in fields(TrajectoryStep)}
        steps = []
        for index, step in enumerate(data.get("steps", [])):
            if not isinstance(step, dict):
                raise TypeError(f"trajectory step {index} must be a dict, got {type(step).__name__}")
            steps.append(TrajectoryStep(**{k: v for k, v in step.items() if k in step_keys}))
        kwargs["steps"] = steps
        return cls(**kwargs)


def record_score(trajectory: Trajectory, info: Mapping[str, Any]) -> None:
    """After a step is appended to `trajectory.steps`: the score it left, in `meta["scores"]` (one per step), which
    the analyzer's prompt of a scored world shows. The step info's "score"; the last one when it has none (an
    unparsable answer, a failed environment); None before any. Nothing while no step has had a score."""
    scores = trajectory.meta.get("scores")
    score = info.get("score") if "error" not in info else None
    if scores is None:
        if score is None:
            return
        scores = trajectory.meta["scores"] = [None] * (len(trajectory.steps) - 1)
    if score is None:
        score = next((s for s in reversed(scores) if s is not None), None)
    scores.append(score)
