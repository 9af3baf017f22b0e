"""From a rollout and its privileged text to the scorer's step samples (docs/algorithms.md, 'Teacher context and
insertion points' and 'SEED'). The rules (where each skill goes, the truncation rule) live in seedfast.context;
this module reads the config and counts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from seedfast.config import Config
from seedfast.context.sample import StepSample
from seedfast.context.skill import SkillIds
from seedfast.context.teacher import fit_step, place_skills
from seedfast.rollout.records import StepRecord
from seedfast.train.privileged import Privileged


def skills_for_step(cfg: Config, privileged: Privileged, record: StepRecord,
                    ids: SkillIds) -> list[tuple[str, list[int]]]:
    """The (insertion mode, privileged ids) pairs of one step, following skill_mode and teacher_mode."""
    t = record.trajectory_index
    episode = privileged.episode[t]
    step = privileged.step[t].get(record.step_index) if privileged.step else None
    placed = place_skills(record.insert_points(), cfg.skill.insertion, episode, step, cfg.skill.teacher_mode)
    return [(mode, ids(text)) for mode, text in placed]


def build_samples(cfg: Config, records: Sequence[StepRecord], privileged: Privileged | None,
                  tokenizer: Any) -> tuple[list[StepSample], dict[str, float]]:
    """One StepSample per step record; the teacher context follows the truncation rule (never cuts S or A)."""
    samples, dropped_turns, truncated, too_long = [], 0, 0, 0
    ids = SkillIds(tokenizer, max_tokens=cfg.skill.max_skill_tokens)
    for record in records:
        skills = skills_for_step(cfg, privileged, record, ids) if privileged else []
        fit = fit_step(record.to_sample, skills, cfg.rollout.max_prompt_length, len(record.response_ids))
        samples.append(fit.sample)
        dropped_turns += fit.dropped_turns
        truncated += fit.dropped_turns > 0
        too_long += fit.too_long
    n = max(len(records), 1)
    return samples, {"samples/teacher_truncated_rate": truncated / n,
                     "samples/teacher_too_long": float(too_long),
                     "samples/teacher_dropped_turns": float(dropped_turns),
                     "samples/teacher_valid_rate": sum(s.has_teacher for s in samples) / n}
