"""The teacher context, in one place (docs/algorithms.md, 'Teacher context and insertion points'): prompt segments
and their insertion points, how a skill is rendered, where each skill of a step goes, which history survives
truncation, and the StepSample that carries what the teacher sees.

Config-free (every choice is an argument) and free of other seedfast imports: rollout, scoring and train import it.

    segments.py  Segment, insert_points / insertion_index, join_segments
    skill.py     render_skill, skill_segment, SkillIds
    teacher.py   place_skills, fit_teacher_context (the truncation rule), build_step_sample, fit_step
    sample.py    StepSample (P, A, insertions, dropped spans), TokenIds, as_token_tensor
"""

from seedfast.context.sample import StepSample, TokenIds, as_token_tensor
from seedfast.context.segments import (
    INSERTION_MODES,
    KIND_ORDER,
    Segment,
    check_segments,
    insert_points,
    insertion_index,
    join_segments,
    segment_bounds,
)
from seedfast.context.skill import SkillIds, render_skill, skill_segment
from seedfast.context.teacher import (
    LATE,
    TEACHER_MODES,
    StepTeacher,
    TeacherFit,
    build_step_sample,
    fit_step,
    fit_teacher_context,
    place_skills,
)

__all__ = [
    "INSERTION_MODES", "KIND_ORDER", "LATE", "TEACHER_MODES", "Segment", "SkillIds", "StepSample", "StepTeacher",
    "TeacherFit", "TokenIds", "as_token_tensor", "build_step_sample", "check_segments", "fit_step",
    "fit_teacher_context", "insert_points", "insertion_index", "join_segments", "place_skills",
    "render_skill", "segment_bounds", "skill_segment",
]
