"""Triton backend of seedfast.ops (protocol in seedfast/ops/dispatch.py): allocate outputs, pick grids, launch.

forward   fused linear -> logprob / entropy / teacher logprob, split over the vocabulary when N is small
backward  per vocabulary chunk: logits gradient G [N, chunk] -> dW[chunk] = Gᵀ·H, dH += G·W[chunk]
token_loss  the per-token loss (docs/algorithms.md), a_t, b_t and metric sums in one launch

On CUDA the autotuned kernels run; on CPU tensors the kernels run only when they were created under
TRITON_INTERPRET=1 (tests), with one small fixed configuration.

Backward design (no atomics, deterministic): the chunk of G (budget SEEDFAST_TRITON_GRAD_CHUNK_MB, default
64 MiB, at least 256 columns) is the only N-by-vocabulary memory. dW of a chunk is complete after one GEMM
whose fp32 accumulator runs over all tokens, so dW needs no fp32 [V, d] buffer (2.2 GB at V=152k, d=3584)
and no atomics; dH accumulates over chunks in an fp32 [N, d] buffer (skipped when one chunk covers V). Every
output tile has one owner, so results are bitwise reproducible. The price: G is written once and read twice
(6·N·V bytes: ~4% of the three GEMMs' time at d=3584 on an H100-class GPU), and G is rounded to the input
dtype before its GEMMs (as any tensor-core backward of logits does). Fully fused alternatives need either
fp32 atomics into dH and dW (non-deterministic, fp32 dW buffer) or one more recomputation of the logits.
"""

from __future__ import annotations

import contextlib
import math
import os

import torch

from seedfast.kernels import autotuned as _tuned
from seedfast.kernels import configs as _configs
from seedfast.kernels import linear_logprob_bwd as _bwd
from seedfast.kernels import linear_logprob_fwd as _fwd
from seedfast.kernels import matmul as _mm
from seedfast.kernels import token_loss as _tl

from .validate import check_target_range

KL_KINDS = {"k1": _tl.KL_K1, "k2": _tl.KL_K2, "low_var_kl": _tl.KL_LOW_VAR, "k3": _tl.KL_LOW_VAR}
GATES = {"gap": _tl.GATE_GAP, "entropy": _tl.GATE_ENTROPY, "soft_or": _tl.GATE_SOFT_OR}
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ----------------------------------------------------------------------------------------- helpers

def _interpreted() -> bool:
    return type(_fwd.linear_logprob_fwd_kernel).__name__ == "InterpretedFunction"


def _check_device(*tensors: torch.Tensor) -> None:
    device = tensors[0].device
    for t in tensors:
        if t.device != device:
            raise ValueError(f"all tensors must be on one device, got {device} and {t.device}")
    if device.type != "cuda" and not _interpreted():
        raise ValueError(
            f"the triton backend got {device.type} tensors; it runs on CUDA, or on CPU only when "
            "TRITON_INTERPRET=1 was set before seedfast.kernels was imported"
        )


def _reject_dtensor(name: str, t: torch.Tensor) -> None:
    # A DTensor's data_ptr() is not its local shard (FSDP2): kernels would read garbage or crash.
    if type(t).__name__ == "DTensor":
        raise TypeError(f"{name} is a DTensor; pass .full_tensor() or .to_local() explicitly")


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs must stay fp32 ("ieee"): tf32 would cost 3 decimal digits. 16-bit inputs ignore it.
    return "ieee" if dtype == torch.float32 else "tf32"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _on(device: torch.device):
    """Launch on the tensors' GPU, whatever the current device is."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _capability(device: torch.device) -> int:
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def _validate_linear(hidden, weight, targets, teacher_hidden, temperature) -> None:
    for name, t in (("hidden", hidden), ("weight", weight), ("teacher_hidden", teacher_hidden)):
        if t is None:
            continue
        _reject_dtensor(name, t)
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor, got {getattr(t, 'shape', type(t))}")
        if t.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32/bfloat16/float16, got {t.dtype}")
    if hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)} differ in d")
    if weight.dtype != hidden.dtype:
        raise ValueError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must have the same dtype")
    if teacher_hidden is not None and (teacher_hidden.shape != hidden.shape or teacher_hidden.dtype != hidden.dtype):
        raise ValueError(
            f"teacher_hidden {tuple(teacher_hidden.shape)} {teacher_hidden.dtype} must match "
            f"hidden {tuple(hidden.shape)} {hidden.dtype}"
        )
    if not isinstance(targets, torch.Tensor) or targets.dim() != 1 or targets.shape[0] != hidden.shape[0]:
        raise ValueError(f"targets must be [N={hidden.shape[0]}], got {getattr(targets, 'shape', type(targets))}")
    if targets.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"targets must be int64, got {targets.dtype}")
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    _check_device(*(t for t in (hidden, weight, targets, teacher_hidden) if t is not None))


def choose_n_splits(n_tokens: int, vocab: int, device: torch.device) -> tuple[int, int]:
    """(vocabulary splits, token blocks per program group) for the forward grid.

    At least 8 splits, so that a group of about one wave holds few hidden blocks and few W tiles (both
    reused from L2, see seedfast/kernels/linear_logprob_fwd.py); more when N is small, so that token blocks x splits
    still fill the GPU about 4 times over."""
    sms = _sm_count(device)
    token_blocks = max(1, math.ceil(n_tokens / (32 if _interpreted() else 128)))
    splits = max(1, min(max(8, math.ceil(4 * sms / token_blocks)), math.ceil(vocab / 256), 256))
    return splits, max(1, math.ceil(sms / splits))


def choose_grad_chunk(n_tokens: int, vocab: int, elem_bytes: int) -> int:
    """Vocabulary columns per backward chunk: G [N, chunk] within the memory budget, a multiple of 256."""
    budget = float(os.environ.get("SEEDFAST_TRITON_GRAD_CHUNK_MB", "64")) * 2**20
    chunk = int(budget // max(1, n_tokens * elem_bytes)) // 256 * 256
    return max(256, min(chunk, math.ceil(vocab / 256) * 256))


# ----------------------------------------------------------------------------------------- forward

def forward(hidden, weight, targets, teacher_hidden=None, temperature=1.0, with_entropy=False,
            ignore_index=-100, *, n_splits: int | None = None, check_targets: bool = True):
    """-> (logprob [N] f32, entropy [N] f32 | None, teacher_logprob [N] f32 | None, lse [N] f32).

    check_targets=False skips the target-range check (a host sync) for callers that ran it already (the
    public ops do, in validate.check_linear_inputs): out-of-range ids would silently give logprob = -lse."""
    _validate_linear(hidden, weight, targets, teacher_hidden, temperature)
    n, d = hidden.shape
    vocab = weight.shape[0]
    dev = hidden.device
    f32 = dict(device=dev, dtype=torch.float32)
    has_teacher = teacher_hidden is not None
    if n == 0:
        empty = torch.empty(0, **f32)
        return empty, (empty.clone() if with_entropy else None), (empty.clone() if has_teacher else None), empty
    if vocab == 0:
        raise ValueError("weight has V = 0 rows")
    if check_targets:
        check_target_range("forward", targets, vocab, ignore_index)
    targets = targets.contiguous()
    splits, group_n = choose_n_splits(n, vocab, dev)
    with _on(dev):
        return _forward(hidden, weight, targets, teacher_hidden, temperature, with_entropy, ignore_index,
                        n_splits or splits, group_n)


def _forward(hidden, weight, targets, teacher_hidden, temperature, with_entropy, ignore_index, splits, group_n):
    n, d = hidden.shape
    vocab = weight.shape[0]
    f32 = dict(device=hidden.device, dtype=torch.float32)
    has_teacher = teacher_hidden is not None
    part = lambda: torch.empty((splits, n), **f32)  # noqa: E731
    m, s, zy = part(), part(), part()
    u = part() if with_entropy else m
    mt, st, zyt = (part(), part(), part()) if has_teacher else (m, s, zy)
    th = teacher_hidden if has_teacher else hidden
    args = (hidden, th, weight, targets, m, s, u, zy, mt, st, zyt, n, vocab, d, splits, group_n,
            hidden.stride(0), hidden.stride(1), th.stride(0), th.stride(1), weight.stride(0), weight.stride(1),
            1.0 / temperature)
    flags = dict(HAS_TEACHER=has_teacher, WITH_ENTROPY=with_entropy, DOT_PRECISION=_dot_precision(hidden.dtype))
    if _interpreted():
        cfg = _configs.INTERPRET_FWD
        _fwd.linear_logprob_fwd_kernel[(math.ceil(n / cfg["BLOCK_N"]) * splits,)](*args, **flags, **cfg)
    else:
        kernel = _tuned.tuned("fwd_dual" if has_teacher else "fwd_single", _capability(hidden.device),
                              hidden.dtype == torch.float32)
        kernel[lambda meta: (_cdiv(n, meta["BLOCK_N"]) * splits,)](*args, **flags)

    logprob = torch.empty(n, **f32)
    lse = torch.empty(n, **f32)
    entropy = torch.empty(n, **f32) if with_entropy else None
    teacher_logprob = torch.empty(n, **f32) if has_teacher else None
    block = _configs.INTERPRET_REDUCE_BLOCK if _interpreted() else _configs.REDUCE_BLOCK
    _fwd.linear_logprob_reduce_kernel[(math.ceil(n / block),)](
        m, s, u, zy, mt, st, zyt, targets,
        logprob, entropy if with_entropy else logprob, lse, teacher_logprob if has_teacher else logprob,
        n, splits, ignore_index,
        HAS_TEACHER=has_teacher, WITH_ENTROPY=with_entropy, BLOCK=block,
    )
    return logprob, entropy, teacher_logprob, lse


# ----------------------------------------------------------------------------------------- backward

def _check_per_token(n: int, device: torch.device, **tensors) -> None:
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.shape != (n,):
            raise ValueError(f"{name} must be [N={n}], got {getattr(t, 'shape', type(t))}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, expected {device}")


def backward(hidden, weight, targets, lse, entropy, grad_logprob, grad_entropy, temperature=1.0,
             ignore_index=-100, *, chunk: int | None = None, need_hidden_grad: bool = True,
             need_weight_grad: bool = True):
    """-> (grad_hidden [N, d] hidden.dtype | None, grad_weight [V, d] weight.dtype | None).

    A gradient with need_*_grad=False is None and its GEMM is not launched (a frozen LM head: no dW GEMM);
    with neither needed nothing is launched."""
    _validate_linear(hidden, weight, targets, None, temperature)
    n, d = hidden.shape
    vocab = weight.shape[0]
    dev = hidden.device
    _check_per_token(n, dev, lse=lse, entropy=entropy, grad_logprob=grad_logprob, grad_entropy=grad_entropy)
    if grad_entropy is not None and entropy is None:
        raise ValueError("grad_entropy needs the entropy saved by forward (entropy is None)")
    if not (need_hidden_grad or need_weight_grad):
        return None, None
    if n == 0 or vocab == 0:
        return (torch.zeros_like(hidden) if need_hidden_grad else None,
                torch.zeros_like(weight) if need_weight_grad else None)
    with _on(dev):
        return _backward(hidden, weight, targets.contiguous(), lse, entropy, grad_logprob, grad_entropy,
                         temperature, ignore_index, chunk, need_hidden_grad, need_weight_grad)


def _backward(hidden, weight, targets, lse, entropy, grad_logprob, grad_entropy, temperature, ignore_index,
              chunk, need_hidden_grad, need_weight_grad):
    n, d = hidden.shape
    vocab = weight.shape[0]
    dev = hidden.device
    ignored = targets == ignore_index
    a = grad_logprob.float().masked_fill(ignored, 0.0).contiguous()
    has_b = grad_entropy is not None
    b = grad_entropy.float().masked_fill(ignored, 0.0).contiguous() if has_b else a
    ent = entropy.float().contiguous() if has_b else a
    lse = lse.float().contiguous()

    chunk = chunk or choose_grad_chunk(n, vocab, hidden.element_size())
    single = chunk >= vocab
    chunk = min(chunk, vocab)
    grad_weight = torch.empty_like(weight) if need_weight_grad else None
    # One chunk: dH is complete after one GEMM and goes straight to the output dtype.
    dh = None
    if need_hidden_grad:
        dh = torch.empty_like(hidden) if single else torch.empty((n, d), device=dev, dtype=torch.float32)
    g = torch.empty((n, chunk), device=dev, dtype=hidden.dtype)
    prec = _dot_precision(hidden.dtype)
    interp = _interpreted()
    for v0 in range(0, vocab, chunk):
        vc = min(chunk, vocab - v0)
        args = (hidden, weight, targets, lse, ent, a, b, g, n, d, v0, v0 + vc,
                hidden.stride(0), hidden.stride(1), weight.stride(0), weight.stride(1), g.stride(0),
                1.0 / temperature)
        if interp:
            cfg = _configs.INTERPRET_GRAD_LOGITS
            grid = (math.ceil(n / cfg["BLOCK_N"]) * math.ceil(vc / cfg["BLOCK_V"]),)
            _bwd.linear_logprob_grad_logits_kernel[grid](*args, HAS_B=has_b, DOT_PRECISION=prec, **cfg)
        else:
            kernel = _tuned.tuned("grad_logits", _capability(dev), hidden.dtype == torch.float32)
            kernel[lambda meta, vc=vc: (_cdiv(n, meta["BLOCK_N"]) * _cdiv(vc, meta["BLOCK_V"]),)](
                *args, HAS_B=has_b, DOT_PRECISION=prec)
        if grad_weight is not None:  # dW[chunk] = Gᵀ·H: [vc, N] x [N, d]
            _matmul(g, (1, g.stride(0)), hidden, grad_weight[v0:v0 + vc], vc, d, n, False, prec, "matmul_dw")
        if dh is not None:  # dH (+)= G·W[chunk]: [N, vc] x [vc, d]
            _matmul(g, (g.stride(0), 1), weight[v0:v0 + vc], dh, n, d, vc, v0 > 0, prec, "matmul_dh")
    grad_hidden = None if dh is None else dh if single else dh.to(hidden.dtype)
    return grad_hidden, grad_weight


def _matmul(a, a_strides, b, c, m, n, k, accumulate, prec, tuned_name) -> None:
    args = (a, b, c, m, n, k, a_strides[0], a_strides[1], b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    if _interpreted():
        cfg = _configs.INTERPRET_MATMUL
        grid = (math.ceil(m / cfg["BLOCK_M"]) * math.ceil(n / cfg["BLOCK_N"]),)
        _mm.matmul_kernel[grid](*args, ACCUMULATE=accumulate, DOT_PRECISION=prec, **cfg)
    else:
        kernel = _tuned.tuned(tuned_name, _capability(c.device), a.dtype == torch.float32)
        kernel[lambda meta: (_cdiv(m, meta["BLOCK_M"]) * _cdiv(n, meta["BLOCK_N"]),)](
            *args, ACCUMULATE=accumulate, DOT_PRECISION=prec)


# ----------------------------------------------------------------------------------------- token loss

def token_loss(logprob, entropy, old_logprob, ref_logprob, teacher_logprob, teacher_mask, advantages,
               token_weights, *, clip_low=0.2, clip_high=0.2, dual_clip=3.0, kl_coef=0.0, kl_kind="low_var_kl",
               entropy_coef=0.0, opd_coef=0.0, opd_beta=5.0, gate="gap", block: int | None = None,
               n_programs: int | None = None):
    """-> (loss 0-dim f32, a [N] f32, b [N] f32 | None, metric sums), as seedfast/ops/token_loss.py.

    Metric sums: weight (Σw), clip_frac, ratio_min/ratio_max (±inf without a weighted token), kl (with
    ref_logprob), entropy (with entropy), teacher_weight (Σw·m), gate and opd_term (with teacher_logprob,
    when the gate's inputs are there). b is None when entropy_coef == 0. old_logprob None: on-policy.
    """
    if not isinstance(logprob, torch.Tensor) or logprob.dim() != 1:
        raise ValueError(f"logprob must be a 1-D [N] tensor, got {getattr(logprob, 'shape', type(logprob))}")
    n = logprob.shape[0]
    dev = logprob.device
    if old_logprob is None:  # on-policy: ℓold = sg(ℓθ)
        old_logprob = logprob
    per_token = dict(entropy=entropy, old_logprob=old_logprob, ref_logprob=ref_logprob,
                     teacher_logprob=teacher_logprob, teacher_mask=teacher_mask, advantages=advantages,
                     token_weights=token_weights)
    for name in ("old_logprob", "advantages", "token_weights"):
        if per_token[name] is None:
            raise ValueError(f"{name} is required")
    _check_per_token(n, dev, **per_token)
    if kl_kind not in KL_KINDS:
        raise ValueError(f"kl_kind must be one of {sorted(KL_KINDS)}, got {kl_kind!r}")
    if gate not in GATES:
        raise ValueError(f"gate must be one of {sorted(GATES)}, got {gate!r}")
    if kl_coef != 0 and ref_logprob is None:
        raise ValueError("kl_coef != 0 needs ref_logprob")
    if entropy_coef != 0 and entropy is None:
        raise ValueError(f"entropy_coef={entropy_coef} needs entropy")
    # As the torch backend: OPD terms exist when the gate can be evaluated (gap, or entropy given).
    has_opd = teacher_logprob is not None and (gate == "gap" or entropy is not None)
    if opd_coef != 0 and not has_opd:
        raise ValueError(f"opd_coef={opd_coef} needs teacher_logprob" +
                         ("" if teacher_logprob is None else f" and entropy for gate={gate!r}"))
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 or None, got {dual_clip}")
    _check_device(logprob)

    def f32(t):
        if t is None:
            return None
        return t.detach().to(torch.float32).contiguous()

    lp, ent, old, ref, teacher, tmask, adv, w = (f32(t) for t in (
        logprob, entropy, old_logprob, ref_logprob, teacher_logprob, teacher_mask, advantages, token_weights))
    write_b = entropy_coef != 0
    a = torch.empty(n, device=dev, dtype=torch.float32)
    b = torch.empty(n, device=dev, dtype=torch.float32) if write_b else None
    interp = _interpreted()
    block = block or (_configs.INTERPRET_TOKEN_LOSS_BLOCK if interp else _configs.TOKEN_LOSS_BLOCK)
    programs = n_programs or max(1, min(math.ceil(n / block), 2 * _sm_count(dev)))
    stats = torch.empty((programs, _tl.N_STATS), device=dev, dtype=torch.float32)
    with _on(dev):
        _tl.token_loss_kernel[(programs,)](
            lp, ent if ent is not None else lp, old, ref if ref is not None else lp,
            teacher if teacher is not None else lp, tmask if tmask is not None else lp, adv, w,
            a, b if write_b else a, stats, n,
            float(clip_low), float(clip_high), float(dual_clip or 0.0), float(kl_coef), float(entropy_coef),
            float(opd_coef), float(opd_beta),
            HAS_ENTROPY=ent is not None, HAS_DUAL_CLIP=dual_clip is not None,
            KL_KIND=KL_KINDS[kl_kind] if ref is not None else _tl.KL_NONE,
            HAS_OPD=has_opd, HAS_TMASK=tmask is not None, GATE=GATES[gate], WRITE_B=write_b, BLOCK=block,
            **({} if interp else {"num_warps": _configs.TOKEN_LOSS_NUM_WARPS}),
        )
    col = dict(zip(_tl.STAT_NAMES, stats.unbind(1)))
    sums = {"weight": col["weight"].sum(), "clip_frac": col["clip_frac"].sum(),
            "ratio_min": col["ratio_min"].min(), "ratio_max": col["ratio_max"].max()}
    if ref is not None:
        sums["kl"] = col["kl"].sum()
    if ent is not None:
        sums["entropy"] = col["entropy"].sum()
    if has_opd:
        for key in ("teacher_weight", "gate", "opd_term"):
            sums[key] = col[key].sum()
    return col["loss"].sum(), a, b, sums

