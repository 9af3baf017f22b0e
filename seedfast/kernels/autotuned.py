"""The kernels wrapped in triton.autotune with the candidates of configs.py, one autotuner per architecture
(built on first use; used on CUDA only).

Keys hold what changes the best tile (d, context count, entropy, dot precision; Triton adds the tensor
dtypes), not N: token counts change every micro-batch and must not re-trigger tuning.
"""

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


def candidates(name: str, arch: int, fp32: bool = False) -> list:
    """The autotune candidates of kernel `name` on architecture key `arch` (90 or 80)."""
    if fp32:
        return configs.FP32_CONFIGS[_FP32_FAMILY[name]][arch]
    return _SPECS[name][1][arch]


def tuned(name: str, capability: int, fp32: bool = False):
    """The autotuned kernel `name` for a device of compute capability `capability` (major·10 + minor),
    for 16-bit inputs or (fp32=True) fp32 inputs."""
    arch = configs.arch_key(capability)
    if (name, arch, fp32) not in _built:
        kernel, _, kwargs = _SPECS[name]
        _built[name, arch, fp32] = triton.autotune(configs=candidates(name, arch, fp32), **kwargs)(kernel)
    return _built[name, arch, fp32]
