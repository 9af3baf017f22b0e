"""Triton kernels only (installed as seedfast.kernels). No autograd, no framework glue: the launchers live in
seedfast/ops/triton_backend.py.

linear_logprob_fwd   fused z = h·Wᵀ/T -> online max / Σexp / entropy / target logit per vocabulary split,
                     optional teacher rows on the same W tiles; the split-merging reduce kernel
linear_logprob_bwd   logits gradient a·(onehot - p) + b·(-p⊙(log p + H)) of one vocabulary chunk (recomputed logits)
fused_rows           single-pass loss: row statistics and the logits gradient from a stored block of logits
token_loss           per-token loss (docs/algorithms.md), a_t, b_t and metric partial sums in one launch
configs / autotuned  autotune candidates per architecture, and the autotuned wrappers
The GEMMs without an epilogue (dW, dH, the single pass's logits) are cuBLAS: docs/kernels.md.
"""
