"""What a rollout hands to the trainer: one record per environment step, and run counters."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from seedfast.context.sample import StepSample, TokenIds
from seedfast.context.segments import Segment, insert_points
from seedfast.context.teacher import build_step_sample
from seedfast.envs.trajectory import Trajectory


@dataclass(frozen=True, eq=False)
class StepRecord:
    """One step of one trajectory: the prompt as segments, the response ids exactly as generated.

    `group_id` is the task index (the GRPO group), `trajectory_index` indexes RolloutResult.trajectories.
    `reward` = outcome R(τ) of the trajectory minus `penalty`, this step's invalid-action penalty
    (docs/algorithms.md, 'Samples and rewards');
    the two are kept apart so the advantage can treat them differently (algo.advantage.grpo_with_penalty).
    `response_logprobs` are the sampler's log-probs of the response tokens (None if the engine gives none).
    """

    segments: tuple[Segment, ...]
    response_ids: tuple[int, ...]
    response_logprobs: tuple[float, ...] | None
    reward: float
    group_id: int
    trajectory_index: int
    step_index: int
    valid: bool
    parsed: bool
    finish_reason: str
    penalty: float = 0.0

    @property
    def prompt_ids(self) -> list[int]:
        return torch.cat([ids for _, ids in self.segments]).tolist()

    @property
    def sample_id(self) -> tuple[int, int]:
        return (self.trajectory_index, self.step_index)

    def insert_points(self) -> dict[str, int]:
        """Token index of each insertion mode in `prompt_ids` (docs/algorithms.md, 'Teacher context and
        insertion points')."""
        return insert_points(self.segments, self.sample_id)

    def to_sample(
        self,
        skills: Sequence[tuple[str, TokenIds]] = (),
        *,
        max_length: int | None = None,
        teacher_valid: bool = True,
        sample_id: Hashable | None = None,
    ) -> tuple[StepSample, int]:
        """The scorer's StepSample with `(insertion mode, privileged ids)` skills; returns (sample, dropped turns)."""
        meta = {"trajectory_index": self.trajectory_index, "step_index": self.step_index}
        if self.response_logprobs is not None:
            meta["rollout_logprobs"] = torch.tensor(self.response_logprobs, dtype=torch.float32)
        return build_step_sample(
            self.segments,
            list(self.response_ids),
            skills,
            max_length=max_length,
            sample_id=self.sample_id if sample_id is None else sample_id,
            teacher_valid=teacher_valid,
            reward=self.reward,
            penalty=self.penalty,
            group_id=self.group_id,
            meta=meta,
        )


@dataclass
class RolloutStats:
    trajectories: int = 0
    won: int = 0
    steps: int = 0
    invalid_actions: int = 0  # parsed but not admissible, plus unparsable
    unparsable: int = 0
    env_errors: int = 0
    truncated: int = 0  # trajectories stopped at max_steps
    prompt_truncations: int = 0  # prompts whose history window was shortened to fit max_prompt_tokens
    response_truncations: int = 0  # responses stopped by max_new_tokens
    generated_tokens: int = 0
    generate_calls: int = 0

    def as_dict(self) -> dict[str, float]:
        out: dict[str, float] = dict(asdict(self))
        out["success_rate"] = self.won / self.trajectories if self.trajectories else 0.0
        out["invalid_rate"] = self.invalid_actions / self.steps if self.steps else 0.0
        return out


@dataclass
class RolloutResult:
    trajectories: list[Trajectory]
    steps: list[StepRecord]
    stats: RolloutStats = field(default_factory=RolloutStats)

    def steps_of(self, trajectory_index: int) -> list[StepRecord]:
        return [s for s in self.steps if s.trajectory_index == trajectory_index]
