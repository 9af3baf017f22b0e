"""The kernels wrapped in triton.autotune with the candidates of configs.py, one autotuner per architecture
(built on first use; used on CUDA only).

Keys hold what changes the best tile (d, context count, entropy, dot precision; Triton adds the tensor
dtypes) and a bucket of N (the next power of two, 128 to 32768): the best tile at N = 512 (few token blocks, many
vocabulary splits) is not the best at N = 16384, yet raw token counts change every micro-batch and must not
re-trigger tuning. A bucket is its own autotuner over the same kernel (so the key needs no extra kernel argument;
compiled binaries are shared). SEEDFAST_AUTOTUNE_ONE=1 prunes every list to its first candidate: no tuning
(tests, the GPU window's test step).
"""

import os

import triton

from . import configs
from .linear_logprob_bwd import linear_logprob_grad_logits_kernel
from .linear_logprob_fwd import linear_logprob_fwd_kernel

_FWD_KEY = ["D", "HAS_TEACHER", "WITH_ENTROPY", "DOT_PRECISION"]
# name -> (kernel, candidates per arch, autotune keyword arguments)
_SPECS = {
    "fwd_single": (linear_logprob_fwd_kernel, configs.FWD_CONFIGS, dict(key=_FWD_KEY)),
    "fwd_dual": (linear_logprob_fwd_kernel, configs.FWD_DUAL_CONFIGS, dict(key=_FWD_KEY)),
    "grad_logits": (linear_logprob_grad_logits_kernel, configs.GRAD_LOGITS_CONFIGS,
                    dict(key=["D", "HAS_B", "DOT_PRECISION"])),
}
_FP32_FAMILY = {"fwd_single": "fwd", "fwd_dual": "fwd", "grad_logits": "grad_logits"}
_built = {}


N_BUCKET_MIN, N_BUCKET_MAX = 128, 32768


def n_bucket(n_tokens: int) -> int:
    """The autotune bucket of a token count: the next power of two, within [N_BUCKET_MIN, N_BUCKET_MAX]."""
    return min(N_BUCKET_MAX, max(N_BUCKET_MIN, 1 << max(0, int(n_tokens) - 1).bit_length()))


def candidates(name: str, arch: int, fp32: bool = False) -> list:
    """The autotune candidates of kernel `name` on architecture key `arch` (90 or 80); only the first with
    SEEDFAST_AUTOTUNE_ONE=1."""
    found = configs.FP32_CONFIGS[_FP32_FAMILY[name]][arch] if fp32 else _SPECS[name][1][arch]
    return found[:1] if os.environ.get("SEEDFAST_AUTOTUNE_ONE", "0") == "1" else found


def tuned(name: str, capability: int, fp32: bool = False, n_tokens: int = N_BUCKET_MAX):
    """The autotuned kernel `name` for a device of compute capability `capability` (major·10 + minor), for
    16-bit inputs or (fp32=True) fp32 inputs, tuned for the bucket of `n_tokens`."""
    arch = configs.arch_key(capability)
    key = (name, arch, fp32, n_bucket(n_tokens), os.environ.get("SEEDFAST_AUTOTUNE_ONE", "0") == "1")
    if key not in _built:
        kernel, _, kwargs = _SPECS[name]
        _built[key] = triton.autotune(configs=candidates(name, arch, fp32), **kwargs)(kernel)
    return _built[key]
