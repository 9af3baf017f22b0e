"""From a rollout and its privileged text to the scorer's step samples (docs/algorithms.md, 'Teacher context and
insertion points' and 'SEED')."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from seedfast.config import Config
from seedfast.rollout.records import StepRecord
from seedfast.scoring.sample import StepSample
from seedfast.train.privileged import Privileged
from seedfast.train.skill_text import skill_segment

LATE = "before_response"  # step skills always go late (docs/algorithms.md, 'SEED')


def skills_for_step(cfg: Config, privileged: Privileged, record: StepRecord, tokenizer: Any,
                    cache: dict[str, list[int]]) -> list[tuple[str, list[int]]]:
    """The (insertion mode, privileged ids) pairs of one step, following skill_mode and teacher_mode."""
    t = record.trajectory_index

    def ids(text: str) -> list[int]:
        if text not in cache:
            cache[text] = skill_segment(tokenizer, text, max_tokens=cfg.skill.max_skill_tokens)
        return cache[text]

    episode = privileged.episode[t]
    step = privileged.step[t].get(record.step_index) if privileged.step else None
    pairs: list[tuple[str, list[int]]] = []
    if step is not None and cfg.skill.teacher_mode == "step_priority":
        return [(LATE, ids(step))]
    if episode is not None:
        pairs.append((cfg.skill.insertion, ids(episode)))
    if step is not None:
        pairs.append((LATE, ids(step)))
    # insertion points must not decrease: order by where each mode lands
    points = record.insert_points()
    return sorted(pairs, key=lambda p: points[p[0]])


def build_samples(cfg: Config, records: Sequence[StepRecord], privileged: Privileged | None,
                  tokenizer: Any) -> tuple[list[StepSample], dict[str, float]]:
    """One StepSample per step record; the teacher context follows the truncation rule (never cuts S or A)."""
    samples, dropped_turns, truncated, too_long, cache = [], 0, 0, 0, {}
    for record in records:
        skills = skills_for_step(cfg, privileged, record, tokenizer, cache) if privileged else []
        limit = cfg.rollout.max_prompt_length + len(record.response_ids)
        try:
            sample, dropped = record.to_sample(skills, max_length=limit, teacher_valid=bool(skills))
        except ValueError:  # the skill does not fit even without history: this step leaves OPD, counted
            sample, dropped = record.to_sample([], teacher_valid=False)
            too_long += 1
        samples.append(sample)
        dropped_turns += dropped
        truncated += dropped > 0
    n = max(len(records), 1)
    return samples, {"samples/teacher_truncated_rate": truncated / n,
                     "samples/teacher_too_long": float(too_long),
                     "samples/teacher_dropped_turns": float(dropped_turns),
                     "samples/teacher_valid_rate": sum(s.has_teacher for s in samples) / n}
