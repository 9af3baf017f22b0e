"""Shared-prefix dual-context scoring: step samples, prompt segments, ℓold / ℓskill / ℓref without N×V logits.

    from seedfast.scoring import StepSample, score, score_reference, teacher_logprob_with_prefix
"""

from seedfast.scoring.packing import shared_prefix_length
from seedfast.scoring.results import ScoreResult, Scores
from seedfast.scoring.sample import StepSample
from seedfast.scoring.score import DEFAULT_TOKEN_BUDGET, score, score_reference
from seedfast.scoring.segments import (
    INSERTION_MODES,
    Segment,
    build_step_sample,
    fit_teacher_context,
    insertion_index,
    join_segments,
)
from seedfast.scoring.teacher_current import teacher_logprob_with_prefix

__all__ = [
    "DEFAULT_TOKEN_BUDGET",
    "INSERTION_MODES",
    "ScoreResult",
    "Scores",
    "Segment",
    "StepSample",
    "build_step_sample",
    "fit_teacher_context",
    "insertion_index",
    "join_segments",
    "score",
    "score_reference",
    "shared_prefix_length",
    "teacher_logprob_with_prefix",
]
