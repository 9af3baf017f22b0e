"""Triton backend of the divergence protocol (the torch one: seedfast/ops/chunked_divergence.py): allocate, pick grids,
launch the kernels of seedfast/kernels/divergence.py. Design and FLOPs: docs/kernels.md, "Divergence kernels".

divergence_forward   reverse_kl / forward_kl: one online pass over V (2 GEMMs' worth: student and teacher logits on
                     each W tile); jsd: a pass for both lse, then a pass for the sums (4 GEMMs' worth)
divergence_partial   the value and center sums over this weight's rows with given global normalizers (the
                     vocabulary-parallel head: each rank holds a shard of W)
divergence_backward  two passes, as linear_logprob's backward: per vocabulary chunk G = coef·∂D/∂z_s from recomputed
                     logits of both contexts (Triton), then dW[chunk] = Gᵀ·h and dH += G·W[chunk] (cuBLAS)

The divergence ops find it through seedfast/ops/dispatch.py get_divergence_backend; it uses triton_backend's launch
helpers (that module never imports this one).
"""

from __future__ import annotations

import math
import os

import torch
import triton

from seedfast.kernels import autotuned, configs
from seedfast.kernels import divergence as kernels
from seedfast.sampling_params import check_scoring_temperature

from . import triton_backend as tb

KINDS = {"reverse_kl": kernels.KIND_REVERSE_KL, "forward_kl": kernels.KIND_FORWARD_KL, "jsd": kernels.KIND_JSD}
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# name -> (kernel, 16-bit candidates per arch, fp32 candidates per arch, autotune key)
_SPECS = {
    "div_stats": (kernels.divergence_stats_kernel, configs.DIVERGENCE_CONFIGS, configs.FP32_DIVERGENCE_CONFIGS,
                  ["D", "KIND", "DOT_PRECISION"]),
    "div_sums": (kernels.divergence_sums_kernel, configs.DIVERGENCE_CONFIGS, configs.FP32_DIVERGENCE_CONFIGS,
                 ["D", "KIND", "DOT_PRECISION"]),
    "div_grad": (kernels.divergence_grad_kernel, configs.DIVERGENCE_GRAD_CONFIGS,
                 configs.FP32_DIVERGENCE_GRAD_CONFIGS, ["D", "KIND", "DOT_PRECISION"]),
}
_built: dict = {}


def candidates(name: str, arch: int, fp32: bool = False) -> list:
    """The autotune candidates of divergence kernel `name` (div_stats, div_sums, div_grad) on architecture key `arch`;
    only the first with SEEDFAST_AUTOTUNE_ONE=1 (as seedfast/kernels/autotuned.py)."""
    _, lists, fp32_lists, _ = _SPECS[name]
    found = (fp32_lists if fp32 else lists)[arch]
    return found[:1] if os.environ.get("SEEDFAST_AUTOTUNE_ONE", "0") == "1" else found


def _tuned(name: str, capability: int, fp32: bool, n_tokens: int):
    arch = configs.arch_key(capability)
    key = (name, arch, fp32, autotuned.n_bucket(n_tokens), os.environ.get("SEEDFAST_AUTOTUNE_ONE", "0") == "1")
    if key not in _built:
        kernel, _, _, tune_key = _SPECS[name]
        _built[key] = triton.autotune(configs=candidates(name, arch, fp32), key=tune_key)(kernel)
    return _built[key]


def _launch(name: str, grid, args: tuple, flags: dict, config, n: int, hidden: torch.Tensor) -> None:
    """One launch of kernel `name`: the given candidate, the interpreter's configuration, or the autotuner's pick.
    `grid` maps the block sizes to the grid."""
    kernel = _SPECS[name][0]
    if config is not None:
        kernel[grid(config.kwargs)](*args, **flags, **tb._launch_options(config))
    elif tb._interpreted():
        cfg = configs.INTERPRET_DIVERGENCE_GRAD if name == "div_grad" else configs.INTERPRET_DIVERGENCE
        kernel[grid(cfg)](*args, **flags, **cfg)
    else:
        tuned = _tuned(name, tb._capability(hidden.device), hidden.dtype == torch.float32, n)
        tuned[grid](*args, **flags)


def _validate(hidden, teacher_hidden, weight, kind, beta, temperature, **per_token) -> int:
    for name, t in (("hidden", hidden), ("teacher_hidden", teacher_hidden), ("weight", weight)):
        tb._reject_dtensor(name, t)
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor, got {getattr(t, 'shape', type(t))}")
        if t.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32/bfloat16/float16, got {t.dtype}")
    if teacher_hidden.shape != hidden.shape or teacher_hidden.dtype != hidden.dtype:
        raise ValueError(f"teacher_hidden {tuple(teacher_hidden.shape)} {teacher_hidden.dtype} must match hidden "
                         f"{tuple(hidden.shape)} {hidden.dtype}")
    if weight.shape[1] != hidden.shape[1] or weight.dtype != hidden.dtype:
        raise ValueError(f"weight {tuple(weight.shape)} {weight.dtype} must be [V, d={hidden.shape[1]}] "
                         f"{hidden.dtype}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    if kind == "jsd" and not (isinstance(beta, (int, float)) and 0.0 < beta < 1.0):
        raise ValueError(f"jsd needs 0 < beta < 1, got {beta!r}")
    check_scoring_temperature(temperature)
    n = hidden.shape[0]
    for name, t in per_token.items():
        if not isinstance(t, torch.Tensor) or t.shape != (n,):
            raise ValueError(f"{name} must be [N={n}], got {getattr(t, 'shape', type(t))}")
    if "active" in per_token and per_token["active"].dtype != torch.bool:
        raise ValueError(f"active must be a bool tensor, got {per_token['active'].dtype}")
    tb._check_device(hidden, teacher_hidden, weight, *per_token.values())
    return KINDS[kind]


def _splits(n: int, vocab: int, dev: torch.device, config) -> tuple[int, int]:
    """(vocabulary splits, token blocks per program group): whole waves for the first candidate's tile (or `config`'s),
    as the forward of linear_logprob (triton_backend.wave_splits)."""
    if config is not None:
        block_n, block_v = config.kwargs["BLOCK_N"], config.kwargs["BLOCK_V"]
    elif tb._interpreted():
        block_n, block_v = configs.INTERPRET_DIVERGENCE["BLOCK_N"], configs.INTERPRET_DIVERGENCE["BLOCK_V"]
    else:
        first = configs.DIVERGENCE_CONFIGS[configs.arch_key(tb._capability(dev))][0].kwargs
        block_n, block_v = first["BLOCK_N"], first["BLOCK_V"]
    blocks = tb._cdiv(n, block_n)
    return tb.wave_splits(blocks, tb._cdiv(vocab, block_v), tb._sm_count(dev)), min(blocks,
                                                                                    configs.FWD_GROUP_TOKEN_BLOCKS)


def _hidden_args(hidden, teacher_hidden, weight) -> tuple:
    return (hidden.stride(0), hidden.stride(1), teacher_hidden.stride(0), teacher_hidden.stride(1),
            weight.stride(0), weight.stride(1))


def _stats(hidden, teacher_hidden, weight, code, temperature, splits, group_n, config):
    """-> (lse, teacher_lse, KL | None): one online pass; the KL for reverse_kl / forward_kl."""
    n, d = hidden.shape
    vocab = weight.shape[0]
    f32 = dict(device=hidden.device, dtype=torch.float32)
    ms, ss, mt, st = (torch.empty((splits, n), **f32) for _ in range(4))
    has_x = code != kernels.KIND_JSD
    x = torch.empty((splits, n), **f32) if has_x else ms
    args = (hidden, teacher_hidden, weight, ms, ss, mt, st, x, n, vocab, d, splits, group_n,
            *_hidden_args(hidden, teacher_hidden, weight), 1.0 / temperature)
    flags = dict(KIND=code, DOT_PRECISION=tb._dot_precision(hidden.dtype))
    _launch("div_stats", lambda c: (tb._cdiv(n, c["BLOCK_N"]) * splits,), args, flags, config, n, hidden)
    lse, tlse = torch.empty(n, **f32), torch.empty(n, **f32)
    kl = torch.empty(n, **f32) if has_x else lse
    # forward_kl's cross term is weighed by the teacher: its side is `a` of the merge
    a, b = ((ms, ss), (mt, st)) if code != kernels.KIND_FORWARD_KL else ((mt, st), (ms, ss))
    lse_a, lse_b = (lse, tlse) if code != kernels.KIND_FORWARD_KL else (tlse, lse)
    block = configs.INTERPRET_REDUCE_BLOCK if tb._interpreted() else configs.REDUCE_BLOCK
    kernels.divergence_merge_kernel[(math.ceil(n / block),)](*a, *b, x, lse_a, lse_b, kl, n, splits, HAS_X=has_x,
                                                             BLOCK=block)
    return lse, tlse, kl if has_x else None


def _sums(hidden, teacher_hidden, weight, lse, teacher_lse, code, beta, temperature, splits, group_n, config):
    """-> (value, center) summed over this weight's rows, with the given normalizers."""
    n, d = hidden.shape
    vocab = weight.shape[0]
    f32 = dict(device=hidden.device, dtype=torch.float32)
    value = torch.empty((splits, n), **f32)
    center = torch.empty((splits, n), **f32) if code == kernels.KIND_JSD else value
    args = (hidden, teacher_hidden, weight, lse.float().contiguous(), teacher_lse.float().contiguous(), value, center,
            n, vocab, d, splits, group_n, *_hidden_args(hidden, teacher_hidden, weight), 1.0 / temperature,
            float(beta))
    flags = dict(KIND=code, DOT_PRECISION=tb._dot_precision(hidden.dtype))
    _launch("div_sums", lambda c: (tb._cdiv(n, c["BLOCK_N"]) * splits,), args, flags, config, n, hidden)
    value = value.sum(0)  # a fixed order over the splits: deterministic
    if code == kernels.KIND_JSD:
        return value, center.sum(0)
    return value, value.clone() if code == kernels.KIND_REVERSE_KL else torch.zeros_like(value)


def _keep(active: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # inactive rows may hold anything (NaN in their hidden state): selected, never multiplied
    return tuple(torch.where(active, t, 0.0) for t in tensors)


def divergence_forward(hidden, teacher_hidden, weight, active, *, kind: str, beta: float = 0.5,
                       temperature: float = 1.0, config=None):
    """-> (value [N], center [N], lse [N], teacher_lse [N]) fp32; rows where `active` is False are 0 in all four.

    center is D for reverse_kl, K = Σ p_s (log p_s − log M) for jsd, 0 for forward_kl (what the backward needs).
    config: one autotune candidate of configs.DIVERGENCE_CONFIGS launched directly (tests check every one)."""
    code = _validate(hidden, teacher_hidden, weight, kind, beta, temperature, active=active)
    n = hidden.shape[0]
    vocab = weight.shape[0]
    if n == 0:
        return tuple(torch.zeros(0, device=hidden.device) for _ in range(4))
    if vocab == 0:
        raise ValueError("weight has V = 0 rows")
    splits, group_n = _splits(n, vocab, hidden.device, config)
    tb.PATHS["divergence.forward"] += 1
    with tb._on(hidden.device):
        lse, tlse, kl = _stats(hidden, teacher_hidden, weight, code, temperature, splits, group_n, config)
        if code == kernels.KIND_JSD:
            value, center = _sums(hidden, teacher_hidden, weight, lse, tlse, code, beta, temperature, splits, group_n,
                                  config)
        else:
            value, center = kl, (kl if code == kernels.KIND_REVERSE_KL else torch.zeros_like(kl))
    return _keep(active, value, center, lse, tlse)


def divergence_partial(hidden, teacher_hidden, weight, active, lse, teacher_lse, *, kind: str, beta: float = 0.5,
                       temperature: float = 1.0, config=None):
    """-> (value_part [N], center_part [N]) fp32: the sums of divergence_forward over this weight's rows only, with
    the global normalizers `lse`, `teacher_lse` (a vocabulary shard's share; the shards' parts add up to the value)."""
    code = _validate(hidden, teacher_hidden, weight, kind, beta, temperature, active=active, lse=lse,
                     teacher_lse=teacher_lse)
    n = hidden.shape[0]
    if n == 0 or weight.shape[0] == 0:
        return torch.zeros(n, device=hidden.device), torch.zeros(n, device=hidden.device)
    splits, group_n = _splits(n, weight.shape[0], hidden.device, config)
    tb.PATHS["divergence.partial"] += 1
    with tb._on(hidden.device):
        value, center = _sums(hidden, teacher_hidden, weight, lse, teacher_lse, code, beta, temperature, splits,
                              group_n, config)
    return _keep(active, value, center)


def grad_bound(kind: str, beta: float, center: torch.Tensor) -> torch.Tensor:
    """Per row, a bound on max_v |∂D/∂z_s| (docs/kernels.md, "Divergence kernels"): reverse_kl 2|D| + 1/e (each
    p_v·log(p_v/q_v) lies in [−1/e, D + 1/e]), forward_kl 1 (|p_s − p_t|), jsd (1−β)·(max(1/e, −log(1−β)) + |K|)
    (log p_s − log M <= −log(1−β))."""
    if kind == "reverse_kl":
        return 2.0 * center.abs() + 0.37
    if kind == "forward_kl":
        return torch.ones_like(center)
    return (1.0 - beta) * (max(0.37, -math.log1p(-beta)) + center.abs())


def divergence_backward(hidden, teacher_hidden, weight, lse, teacher_lse, center, coef, *, kind: str,
                        beta: float = 0.5, temperature: float = 1.0, need_hidden_grad: bool = True,
                        need_weight_grad: bool = True, chunk: int | None = None, config=None):
    """-> (grad_hidden [N, d] hidden.dtype | None, grad_weight [V, d] weight.dtype | None) of Σ_t coef_t·D_t.

    Rows with coef == 0 contribute exactly 0 whatever they hold (NaN included); the teacher takes no gradient. For
    fp16, G is scaled by a power of two before it is rounded (triton_backend._grad_scale, bound: grad_bound).
    chunk: vocabulary columns per G chunk (default: triton_backend.choose_grad_chunk's budget); config: one
    candidate of configs.DIVERGENCE_GRAD_CONFIGS launched directly."""
    _validate(hidden, teacher_hidden, weight, kind, beta, temperature, lse=lse, teacher_lse=teacher_lse,
              center=center, coef=coef)
    if not (need_hidden_grad or need_weight_grad):
        return None, None
    n, d = hidden.shape
    vocab = weight.shape[0]
    if n == 0 or vocab == 0:
        return (torch.zeros_like(hidden) if need_hidden_grad else None,
                torch.zeros_like(weight) if need_weight_grad else None)
    tb.PATHS["divergence.backward"] += 1
    with tb._on(hidden.device):
        return _backward(hidden, teacher_hidden, weight, lse, teacher_lse, center, coef, kind, beta, temperature,
                         need_hidden_grad, need_weight_grad, chunk, config)


def _backward(hidden, teacher_hidden, weight, lse, teacher_lse, center, coef, kind, beta, temperature,
              need_hidden_grad, need_weight_grad, chunk, config):
    n, d = hidden.shape
    vocab = weight.shape[0]
    off = coef == 0
    clean = lambda t: t.float().masked_fill(off, 0.0).contiguous()  # noqa: E731
    coef, center, lse, teacher_lse = clean(coef), clean(center), clean(lse), clean(teacher_lse)
    scale = tb._grad_scale(coef.abs() * grad_bound(kind, beta, center), None, None, temperature, hidden.dtype)

    chunk = chunk or tb.choose_grad_chunk(n, vocab, hidden.element_size())
    single = chunk >= vocab
    chunk = min(chunk, vocab)
    grad_weight = torch.empty_like(weight, memory_format=torch.contiguous_format) if need_weight_grad else None
    # Gᵀ·h multiplies the zero G rows of coef == 0 tokens with their hidden rows: 0·NaN would poison dW.
    h_dw = hidden.masked_fill(off[:, None], 0.0) if need_weight_grad else None
    dh = None
    if need_hidden_grad:  # one chunk: complete after one GEMM, straight in the output dtype
        dh = torch.empty((n, d), device=hidden.device, dtype=hidden.dtype if single else torch.float32)
    g = torch.empty((n, chunk), device=hidden.device, dtype=hidden.dtype)
    flags = dict(KIND=KINDS[kind], DOT_PRECISION=tb._dot_precision(hidden.dtype))
    for v0 in range(0, vocab, chunk):
        vc = min(chunk, vocab - v0)
        gc = g[:, :vc]
        args = (hidden, teacher_hidden, weight, lse, teacher_lse, center, coef, gc, n, d, v0, v0 + vc,
                *_hidden_args(hidden, teacher_hidden, weight), gc.stride(0), 1.0 / temperature, scale, float(beta))
        _launch("div_grad", lambda c, vc=vc: (tb._cdiv(n, c["BLOCK_N"]) * tb._cdiv(vc, c["BLOCK_V"]),), args, flags,
                config, n, hidden)
        if grad_weight is not None:  # dW[chunk] = Gᵀ·h / S
            tb._matmul(gc.t(), h_dw, grad_weight[v0:v0 + vc], False, 1.0 / scale, "matmul_dw")
        if dh is not None:  # dH (+)= G·W[chunk] / S
            tb._matmul(gc, weight[v0:v0 + vc], dh, v0 > 0, 1.0 / scale, "matmul_dh")
    grad_hidden = None if dh is None else dh if single else dh.to(hidden.dtype)
    return grad_hidden, grad_weight
