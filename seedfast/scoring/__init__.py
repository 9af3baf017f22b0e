"""Shared-prefix dual-context scoring: ℓold / ℓskill / ℓref without N×V logits, and the prefix-KV teacher.

    from seedfast.scoring import StepSample, score, score_reference, teacher_logprob_with_prefix

Step samples, prompt segments, insertion points and the truncation rule live in seedfast.context.
"""

from seedfast.context.sample import StepSample
from seedfast.scoring.packing import shared_prefix_length
from seedfast.scoring.prefix_kv_teacher import teacher_logprob_with_prefix
from seedfast.scoring.results import ScoreResult, Scores, spread_scores
from seedfast.scoring.score import DEFAULT_TOKEN_BUDGET, score, score_reference

__all__ = [
    "DEFAULT_TOKEN_BUDGET",
    "ScoreResult",
    "Scores",
    "StepSample",
    "score",
    "score_reference",
    "shared_prefix_length",
    "spread_scores",
    "teacher_logprob_with_prefix",
]
