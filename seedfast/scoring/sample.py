"""The step sample under its older name: StepSample and its helpers live in seedfast.context.sample (the teacher
context in one place, docs/architecture.md); scoring reads them from here."""

from seedfast.context.sample import Splice, StepSample, TokenIds, as_token_tensor, check_samples, spliced_suffix

__all__ = ["Splice", "StepSample", "TokenIds", "as_token_tensor", "check_samples", "spliced_suffix"]
