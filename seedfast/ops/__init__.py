"""Differentiable fused ops over the LM head: log-probs, entropy and the whole RL loss without [N, V] logits.

    from seedfast.ops import LossOptions, fused_divergence, fused_loss, linear_logprob

The Triton backend runs on CUDA; the chunked torch backend (ops/chunked.py) everywhere else.
"""

from seedfast.algo.losses import PLAIN_PPO, LossOptions

from .dispatch import BACKENDS, get_backend
from .divergence import divergence_kind, fused_divergence
from .fused_loss import fused_loss
from .linear_logprob import LinearLogprobOutput, linear_logprob

__all__ = ["BACKENDS", "PLAIN_PPO", "LinearLogprobOutput", "LossOptions", "divergence_kind", "fused_divergence",
           "fused_loss", "get_backend", "linear_logprob"]
