"""What an analyzer returns for one trajectory, and the vocabulary of reasons a skill is rejected."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

SKILL_MODES = ("episode_only", "episode_step", "step_only")
MAX_STEP_SKILLS = 5

# Why a response gives no usable skill (SkillResult.reason); "ok" when it does.
REASONS = {
    "ok": "a usable skill",
    "no_json": "no JSON object in the response",
    "missing_key": "the JSON lacks episode_skill",
    "wrong_type": "episode_skill (or step_skills in step_only mode) has the wrong type",
    "empty": "the skill is blank",
    "copied_template": "the skill is the prompt's placeholder text",
    "too_short": "the skill has too few words to say anything",
    "too_long": "the skill is longer than the limit",
    "echo_task": "the skill only restates the task",
    "no_step_skills": "step_only mode and no valid step skill",
    "request_failed": "the analyzer could not be reached or answered badly",
    "prompt_too_long": "the trajectory does not fit the analyzer's prompt budget",
    "no_walkthrough": "the oracle needs the trajectory's walkthrough",
}


@dataclass
class SkillResult:
    skill: str | None
    step_skills: dict[int, str] = field(default_factory=dict)
    valid: bool = False
    reason: str = "ok"
    raw: str = ""
    summary: str | None = None
    n_dropped_step_skills: int = 0  # malformed, out-of-range or beyond MAX_STEP_SKILLS

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"reason {self.reason!r} is not one of {sorted(REASONS)}")


def invalid(reason: str, raw: str = "") -> SkillResult:
    return SkillResult(skill=None, valid=False, reason=reason, raw=raw)


def count_reasons(results: Iterable[SkillResult]) -> dict[str, int]:
    """How many results had each reason ("ok" included), for metrics."""
    return dict(Counter(result.reason for result in results))


def teacher_texts(result: SkillResult, skill_mode: str) -> tuple[str | None, dict[int, str]]:
    """What the teacher context takes from a valid result under `skill_mode`: (episode skill, step skills)."""
    check_skill_mode(skill_mode)
    if not result.valid:
        return None, {}
    episode = result.skill if skill_mode != "step_only" else None
    return episode, dict(result.step_skills) if skill_mode != "episode_only" else {}


def check_skill_mode(skill_mode: str) -> str:
    if skill_mode not in SKILL_MODES:
        raise ValueError(f"skill_mode {skill_mode!r} is not one of {SKILL_MODES}")
    return skill_mode
