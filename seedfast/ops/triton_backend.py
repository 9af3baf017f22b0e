"""Triton backend of seedfast.ops (protocol in seedfast/ops/dispatch.py): allocate outputs, pick grids, launch.

forward      fused linear -> logprob / entropy / teacher logprob, split over the vocabulary when N is small
backward     two passes over V (8·N·V·d): per vocabulary chunk, the logits gradient G [N, chunk] from recomputed
             logits (Triton), then dW[chunk] = Gᵀ·H and dH += G·W[chunk] (cuBLAS)
fused_forward_backward   the training loss in one pass (6·N·V·d): per block of R tokens, the logits [R, V] once
             (cuBLAS, fp32 out), row statistics, token loss and G (Triton), dH and dW (cuBLAS)
token_loss   the per-token loss (docs/algorithms.md), a_t, b_t and metric sums in one launch
The student-teacher divergences over the full vocabulary (ops/divergence.py) launch from
seedfast/ops/triton_divergence.py, which uses this module's helpers (dispatch.get_divergence_backend finds it).

On CUDA the autotuned kernels run; on CPU tensors the kernels run only when they were created under
TRITON_INTERPRET=1 (tests), with one small fixed configuration; the GEMMs are then torch's CPU matmuls on
fp32 copies (the exact products of 16-bit inputs, fp32 sums: what the GPU's tensor cores compute).

Designs, FLOP counts, memory and traffic: docs/kernels.md. In short: the two-pass backward holds one G chunk
(budget SEEDFAST_TRITON_GRAD_CHUNK_MB, default 256 MiB, so that the fp32 dH accumulation moves <= 10 GB at
N=16k, d=4096, V=152k); dW of a chunk is complete after one GEMM over all tokens (no [V, d] fp32 buffer, no
atomics); results are deterministic. The single pass holds one block of logits (SEEDFAST_TRITON_FUSED_MB,
default 2048 MiB; 0 turns it off) and, with more than one block, an fp32 [V, d] dW accumulator.
For fp16, G is scaled by a power of two S with max|S·G| <= 1 before it is rounded, and the GEMMs divide it
out: per-token-mean weights make G ~ 1/(N·V), which fp16 would flush to zero (bf16 and fp32 need no scale, and
no host sync for it). Ignored rows contribute exactly 0 to dW and dH whatever they hold (NaN included).
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import warnings

import torch

from seedfast.algo.losses import PLAIN_PPO, LossOptions
from seedfast.kernels import autotuned, configs, fused_rows, linear_logprob_bwd, linear_logprob_fwd
from seedfast.kernels.token_loss import (  # the module's own name is this module's launcher, token_loss() below
    GATE_ENTROPY,
    GATE_GAP,
    GATE_SOFT_OR,
    KL_K1,
    KL_K2,
    KL_LOW_VAR,
    KL_NONE,
    N_STATS,
    OPD_ADVANTAGE,
    OPD_GATE,
    OPD_NONE,
    STAT_NAMES,
    token_loss_kernel,
)
from seedfast.sampling_params import check_scoring_temperature

from .token_loss import merge_metric_sums
from .validate import check_target_range

KL_KINDS = {"k1": KL_K1, "k2": KL_K2, "low_var_kl": KL_LOW_VAR, "k3": KL_LOW_VAR}
GATES = {"gap": GATE_GAP, "entropy": GATE_ENTROPY, "soft_or": GATE_SOFT_OR}
# the divergence forms add their term outside the per-token loss (seedfast.ops.fused_divergence): none here
OPD_MODES = {"gate": OPD_GATE, "advantage": OPD_ADVANTAGE, "reverse_kl": OPD_NONE, "jsd": OPD_NONE}
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Which path each call took, counted per process (docs/kernels.md, "Which path runs"): a fallback that keeps the
# numbers right but costs 10x (no fp32-output GEMM, out of memory) must show in tests and benchmark rows. Names:
#   forward                      the Triton forward          backward.two_pass   the two-pass backward
#   fused.single_pass            fused_forward_backward's single pass
#   fused.two_pass:<why>         its fallback: budget (no block of FUSED_MIN_ROWS fits), no_fp32_gemm, out_of_memory,
#                                no_grad (no gradient asked for), empty (N or V = 0)
#   gemm_f32.addmm / gemm_f32.fp32_copies   how an fp32-output GEMM of 16-bit inputs ran on CUDA
#   divergence.forward / divergence.partial / divergence.backward   the divergence launchers (triton_divergence.py)
PATHS: collections.Counter = collections.Counter()


def path_counts() -> dict[str, int]:
    """A copy of the per-process path counters (PATHS)."""
    return dict(PATHS)


def reset_path_counts() -> None:
    PATHS.clear()


def fused_path_taken(counts: dict[str, int]) -> str | None:
    """The one fused_forward_backward path in `counts` ("single_pass", "two_pass:<why>"), "mixed" when calls took
    different ones, None when there was no call."""
    taken = sorted(k.removeprefix("fused.") for k in counts if k.startswith("fused."))
    return None if not taken else taken[0] if len(taken) == 1 else "mixed"


# ----------------------------------------------------------------------------------------- helpers

def _interpreted() -> bool:
    return type(linear_logprob_fwd.linear_logprob_fwd_kernel).__name__ == "InterpretedFunction"


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
    check_scoring_temperature(temperature)
    _check_device(*(t for t in (hidden, weight, targets, teacher_hidden) if t is not None))


def wave_splits(token_blocks: int, vtiles: int, sms: int) -> int:
    """Vocabulary splits (8..256, at most one per tile) maximizing whole-wave use: programs = token_blocks x splits
    fill ceil(programs / sms) waves as fully as possible, and every split gets the same number of tiles."""
    best, best_score = 1, -1.0
    for splits in range(min(8, vtiles), min(256, vtiles) + 1):
        programs = token_blocks * splits
        wave_eff = programs / (math.ceil(programs / sms) * sms)
        split_eff = vtiles / (splits * math.ceil(vtiles / splits))
        score = wave_eff * split_eff - 1e-4 * splits  # ties: fewer splits (less partial-buffer traffic)
        if score > best_score:
            best, best_score = splits, score
    return best


def choose_n_splits(n_tokens: int, vocab: int, device: torch.device) -> tuple[int, int]:
    """(vocabulary splits, token blocks per program group) for the forward grid.

    Splits: wave_splits for the first sm_90 candidate's 128 x 256 tile. The group is FWD_GROUP_TOKEN_BLOCKS token
    blocks (or all of them when there are fewer): with few tokens each W tile is then read from HBM once for
    all token blocks (docs/kernels.md, "Tiles and grids")."""
    block_n, block_v = (32, 64) if _interpreted() else (128, 256)
    token_blocks = max(1, math.ceil(n_tokens / block_n))
    splits = wave_splits(token_blocks, max(1, math.ceil(vocab / block_v)), _sm_count(device))
    return splits, min(token_blocks, configs.FWD_GROUP_TOKEN_BLOCKS)


def choose_grad_chunk(n_tokens: int, vocab: int, elem_bytes: int) -> int:
    """Vocabulary columns per backward chunk: G [N, chunk] within the memory budget, a multiple of 256."""
    budget = float(os.environ.get("SEEDFAST_TRITON_GRAD_CHUNK_MB", "256")) * 2**20
    chunk = int(budget // max(1, n_tokens * elem_bytes)) // 256 * 256
    return max(256, min(chunk, math.ceil(vocab / 256) * 256))


def choose_fused_rows(n_tokens: int, vocab: int, elem_bytes: int, free_bytes: int | None = None, d: int = 0) -> int:
    """Tokens per block of the single pass (0: use forward + token_loss + backward instead).

    A block holds fp32 logits [R, V] and, for 16-bit inputs, a 16-bit G [R, V], within SEEDFAST_TRITON_FUSED_MB
    (default 2048) and, given the device's `free_bytes` (torch.cuda.mem_get_info), within what is free after the
    fp32 [V, d] dW accumulator, dH and a 10% margin. R is a multiple of 128 (whole wgmma tiles for the GEMMs);
    blocks are balanced. Below FUSED_MIN_ROWS rows the fp32 dW read-modify-write per block (8·V·d bytes) outweighs
    the saved GEMM."""
    budget = float(os.environ.get("SEEDFAST_TRITON_FUSED_MB", "2048")) * 2**20
    if free_bytes is not None:
        budget = min(budget, 0.9 * free_bytes - vocab * d * 4 - n_tokens * d * elem_bytes)
    per_row = vocab * (4 + (0 if elem_bytes == 4 else elem_bytes))
    rows = int(budget // max(1, per_row))
    if rows >= n_tokens:
        return max(1, n_tokens)
    if rows < max(1, FUSED_MIN_ROWS):
        return 0
    tile = 128 if rows >= 128 else 1
    rows = rows // tile * tile
    blocks = math.ceil(n_tokens / rows)
    return math.ceil(math.ceil(n_tokens / blocks) / tile) * tile


FUSED_MIN_ROWS = 1024


# ----------------------------------------------------------------------------------------- forward

def forward(hidden, weight, targets, teacher_hidden=None, temperature=1.0, with_entropy=False,
            ignore_index=-100, *, n_splits: int | None = None, group_n: int | None = None,
            check_targets: bool = True, config=None):
    """-> (logprob [N] f32, entropy [N] f32 | None, teacher_logprob [N] f32 | None, lse [N] f32).

    check_targets=False skips the target-range check (a host sync) for callers that ran it already (the
    public ops do, in validate.check_linear_inputs): out-of-range ids would silently give logprob = -lse.
    config: one autotune candidate (a triton.Config of seedfast/kernels/configs.py) launched directly instead of the
    autotuner's pick, with vocabulary splits for its tile (tests check every candidate against fp64)."""
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
    splits, groups = choose_n_splits(n, vocab, dev)
    if config is not None:  # splits for this candidate's tile: at most one per vocabulary tile
        blocks = _cdiv(n, config.kwargs["BLOCK_N"])
        splits = wave_splits(blocks, _cdiv(vocab, config.kwargs["BLOCK_V"]), _sm_count(dev))
        groups = min(blocks, configs.FWD_GROUP_TOKEN_BLOCKS)
    PATHS["forward"] += 1
    with _on(dev):
        return _forward(hidden, weight, targets, teacher_hidden, temperature, with_entropy, ignore_index,
                        n_splits or splits, group_n or groups, config)


def _launch_options(config) -> dict:
    """A candidate's block sizes, and its warps and stages where the kernels compile (the interpreter has none)."""
    return {**config.kwargs, **({} if _interpreted() else dict(num_warps=config.num_warps,
                                                                num_stages=config.num_stages))}


def _forward(hidden, weight, targets, teacher_hidden, temperature, with_entropy, ignore_index, splits, group_n,
             config=None):
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
    if config is not None:
        linear_logprob_fwd.linear_logprob_fwd_kernel[(_cdiv(n, config.kwargs["BLOCK_N"]) * splits,)](
            *args, **flags, **_launch_options(config))
    elif _interpreted():
        cfg = configs.INTERPRET_FWD
        linear_logprob_fwd.linear_logprob_fwd_kernel[(math.ceil(n / cfg["BLOCK_N"]) * splits,)](*args, **flags, **cfg)
    else:
        kernel = autotuned.tuned("fwd_dual" if has_teacher else "fwd_single", _capability(hidden.device),
                              hidden.dtype == torch.float32, n_tokens=n)
        kernel[lambda meta: (_cdiv(n, meta["BLOCK_N"]) * splits,)](*args, **flags)

    logprob = torch.empty(n, **f32)
    lse = torch.empty(n, **f32)
    entropy = torch.empty(n, **f32) if with_entropy else None
    teacher_logprob = torch.empty(n, **f32) if has_teacher else None
    block = configs.INTERPRET_REDUCE_BLOCK if _interpreted() else configs.REDUCE_BLOCK
    linear_logprob_fwd.linear_logprob_reduce_kernel[(math.ceil(n / block),)](
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
             need_weight_grad: bool = True, config=None):
    """-> (grad_hidden [N, d] hidden.dtype | None, grad_weight [V, d] weight.dtype | None).

    A gradient with need_*_grad=False is None and its GEMM is not launched (a frozen LM head: no dW GEMM);
    with neither needed nothing is launched. config: one grad_logits candidate launched directly (as forward's)."""
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
    PATHS["backward.two_pass"] += 1
    with _on(dev):
        return _backward(hidden, weight, targets.contiguous(), lse, entropy, grad_logprob, grad_entropy,
                         temperature, ignore_index, chunk, need_hidden_grad, need_weight_grad, config)


def _grad_scale(a: torch.Tensor, b: torch.Tensor | None, entropy: torch.Tensor | None, temperature: float,
                dtype: torch.dtype = torch.float16, ignored: torch.Tensor | None = None) -> float:
    """A power of two S with max|S·G| <= 1 for G = (a·(onehot - p) - b·p·(log p + H))/T, for a G rounded to
    `dtype`. Only fp16 needs it (one host sync): bf16 and fp32 have fp32's exponent range, so G ~ 1/(N·V) stays
    normal and S = 1 costs nothing. Rows in `ignored` do not count (their a, b may be anything, NaN included).

    |a·(onehot - p)| <= |a| and p·|log p + H| <= 1/e + H, so |G| <= (|a| + |b|·(0.37 + H))/T."""
    if dtype != torch.float16:
        return 1.0
    bound = a.abs()
    if b is not None:
        bound = bound + b.abs() * (0.37 + entropy.abs())
    if ignored is not None:
        bound = bound.masked_fill(ignored, 0.0)
    peak = float(bound.max()) / temperature if bound.numel() else 0.0
    if not math.isfinite(peak) or peak <= 0.0:
        return 1.0
    return math.ldexp(1.0, max(-100, min(100, -math.ceil(math.log2(peak)))))


# device type -> how a 16-bit GEMM with an fp32 output runs: "addmm" (torch.addmm(..., out_dtype=torch.float32),
# torch >= 2.8 on CUDA: cuBLAS reads and writes the fp32 C in its own epilogue) or "none" (older torch, or a device
# without it). Probed once; the hot path never catches errors, so a real failure (OOM, a bad shape) surfaces.
_GEMM_F32: dict[str, str] = {}
_FALLBACK_SLICE_BYTES = 64 << 20


def gemm_f32_mode(device: torch.device | str) -> str:
    """"addmm" where torch.addmm takes out_dtype=float32 beside 16-bit inputs on `device`'s type, else "none"."""
    key = torch.device(device).type
    if key not in _GEMM_F32:
        a = torch.zeros(16, 16, device=device, dtype=torch.bfloat16)
        c = torch.zeros(16, 16, device=device, dtype=torch.float32)
        try:
            torch.addmm(c, a, a, out_dtype=torch.float32, out=c)
            _GEMM_F32[key] = "addmm"
        except (TypeError, RuntimeError, NotImplementedError):
            _GEMM_F32[key] = "none"
    return _GEMM_F32[key]


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


@contextlib.contextmanager
def _full_precision_reduction(dtype: torch.dtype):
    """cuBLAS may split K and reduce the partial sums in the 16-bit output type when allowed (torch's default):
    with K = V = 152k (dH = G·W) that is thousands of rounded additions. Off for the duration of one GEMM."""
    flags = torch.backends.cuda.matmul
    name = ("allow_bf16_reduced_precision_reduction" if dtype == torch.bfloat16
            else "allow_fp16_reduced_precision_reduction" if dtype == torch.float16 else None)
    if name is None:
        yield
        return
    saved = getattr(flags, name)
    setattr(flags, name, False)
    try:
        yield
    finally:
        setattr(flags, name, saved)


def _matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, accumulate: bool, alpha: float, name: str) -> None:
    """out = alpha·(a @ b) (+ out when accumulate): cuBLAS, fp32 accumulation; `out` fp32 or the inputs' dtype.
    `name` labels the launch (tests count them)."""
    beta = 1.0 if accumulate else 0.0
    if a.device.type != "cuda":  # interpreter tests on CPU: exact products of 16-bit values, fp32 sums
        result = (a.float() @ b.float()).mul_(alpha)
        if accumulate:
            out.add_(result.to(out.dtype))
        else:
            out.copy_(result)
        return
    if out.dtype == a.dtype:
        with _full_precision_reduction(out.dtype):
            torch.addmm(out, a, b, beta=beta, alpha=alpha, out=out)
    else:
        _gemm_f32_out(a, b, out, accumulate, alpha)


def _gemm_f32_out(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, accumulate: bool, alpha: float) -> None:
    """fp32 out (+)= alpha·(a @ b) for 16-bit a, b: one cuBLAS call with out_dtype where torch has it; else (only
    the two-pass dH accumulation gets here: the single pass is not taken) fp32 copies in row slices, correct, slow."""
    beta = 1.0 if accumulate else 0.0
    if gemm_f32_mode(a.device) == "addmm":
        PATHS["gemm_f32.addmm"] += 1
        torch.addmm(out, a, b, beta=beta, alpha=alpha, out_dtype=out.dtype, out=out)
        return
    PATHS["gemm_f32.fp32_copies"] += 1
    b32 = b.float()
    step = max(1, _FALLBACK_SLICE_BYTES // max(1, out.shape[1] * 4))
    for r0 in range(0, out.shape[0], step):
        part = a[r0:r0 + step].float() @ b32
        if accumulate:
            out[r0:r0 + step].add_(part, alpha=alpha)
        else:
            out[r0:r0 + step].copy_(part.mul_(alpha))


def _launch_grad_logits(hidden, weight, targets, lse, ent, a, b, g, v0, vc, temperature, scale, has_b,
                        ignore_index, config=None):
    n, d = hidden.shape
    args = (hidden, weight, targets, lse, ent, a, b, g, n, d, v0, v0 + vc,
            hidden.stride(0), hidden.stride(1), weight.stride(0), weight.stride(1), g.stride(0),
            1.0 / temperature, scale, ignore_index)
    prec = _dot_precision(hidden.dtype)
    if config is not None:
        grid = (_cdiv(n, config.kwargs["BLOCK_N"]) * _cdiv(vc, config.kwargs["BLOCK_V"]),)
        linear_logprob_bwd.linear_logprob_grad_logits_kernel[grid](*args, HAS_B=has_b, DOT_PRECISION=prec,
                                                                   **_launch_options(config))
    elif _interpreted():
        cfg = configs.INTERPRET_GRAD_LOGITS
        grid = (math.ceil(n / cfg["BLOCK_N"]) * math.ceil(vc / cfg["BLOCK_V"]),)
        linear_logprob_bwd.linear_logprob_grad_logits_kernel[grid](*args, HAS_B=has_b, DOT_PRECISION=prec, **cfg)
    else:
        kernel = autotuned.tuned("grad_logits", _capability(hidden.device), hidden.dtype == torch.float32, n_tokens=n)
        kernel[lambda meta: (_cdiv(n, meta["BLOCK_N"]) * _cdiv(vc, meta["BLOCK_V"]),)](
            *args, HAS_B=has_b, DOT_PRECISION=prec)


def _backward(hidden, weight, targets, lse, entropy, grad_logprob, grad_entropy, temperature, ignore_index,
              chunk, need_hidden_grad, need_weight_grad, config=None):
    n, d = hidden.shape
    vocab = weight.shape[0]
    dev = hidden.device
    ignored = targets == ignore_index
    a = grad_logprob.float().masked_fill(ignored, 0.0).contiguous()
    has_b = grad_entropy is not None
    b = grad_entropy.float().masked_fill(ignored, 0.0).contiguous() if has_b else a
    ent = entropy.float().contiguous() if has_b else a
    lse = lse.float().contiguous()
    scale = _grad_scale(a, b if has_b else None, ent if has_b else None, temperature, hidden.dtype)

    chunk = chunk or choose_grad_chunk(n, vocab, hidden.element_size())
    single = chunk >= vocab
    chunk = min(chunk, vocab)
    grad_weight = torch.empty_like(weight, memory_format=torch.contiguous_format) if need_weight_grad else None
    # Gᵀ·H multiplies the zero G rows of ignored tokens with their hidden rows: 0·NaN would poison dW.
    h_dw = hidden.masked_fill(ignored[:, None], 0.0) if need_weight_grad else None
    # One chunk: dH is complete after one GEMM and goes straight to the output dtype.
    dh = None
    if need_hidden_grad:
        dh = torch.empty((n, d), device=dev, dtype=hidden.dtype if single else torch.float32)
    g = torch.empty((n, chunk), device=dev, dtype=hidden.dtype)
    for v0 in range(0, vocab, chunk):
        vc = min(chunk, vocab - v0)
        gc = g[:, :vc]
        _launch_grad_logits(hidden, weight, targets, lse, ent, a, b, gc, v0, vc, temperature, scale, has_b,
                            ignore_index, config)
        if grad_weight is not None:  # dW[chunk] = Gᵀ·H / S: [vc, N] x [N, d], the whole token reduction at once
            _matmul(gc.t(), h_dw, grad_weight[v0:v0 + vc], False, 1.0 / scale, "matmul_dw")
        if dh is not None:  # dH (+)= G·W[chunk] / S: [N, vc] x [vc, d]
            _matmul(gc, weight[v0:v0 + vc], dh, v0 > 0, 1.0 / scale, "matmul_dh")
    grad_hidden = None if dh is None else dh if single else dh.to(hidden.dtype)
    return grad_hidden, grad_weight


# ----------------------------------------------------------------------------------------- single pass

def fused_forward_backward(hidden, weight, targets, *, temperature: float, ignore_index: int, with_entropy: bool,
                           per_token: dict, options: LossOptions, need_hidden_grad: bool = True,
                           need_weight_grad: bool = True, rows: int | None = None):
    """(loss, metric sums, grad_hidden | None, grad_weight | None, logprob [N] fp32): the training loss, its
    gradients and the log-probs with the logits of every token formed once (6·N·V·d, docs/kernels.md).

    Same contract as seedfast/ops/chunked.py fused_forward_backward: `per_token` holds token_loss's [N] inputs
    (ignored rows carry token weight 0), `options` its loss options. `rows` overrides the block size (tests); when
    no block of at least FUSED_MIN_ROWS rows fits SEEDFAST_TRITON_FUSED_MB, this runs forward -> token_loss ->
    backward (the two-pass path, 8·N·V·d)."""
    _validate_linear(hidden, weight, targets, None, temperature)
    n, d = hidden.shape
    vocab = weight.shape[0]
    dev = hidden.device
    cuda = dev.type == "cuda"
    if rows is None:
        free = torch.cuda.mem_get_info(dev)[0] if cuda else None
        rows = choose_fused_rows(n, vocab, hidden.element_size(), free, d)
    why = ("empty" if n == 0 or vocab == 0 else "no_grad" if not (need_hidden_grad or need_weight_grad)
           else "budget" if rows == 0 else None)
    if why is None and cuda and hidden.dtype != torch.float32 and gemm_f32_mode(dev) != "addmm":
        why = "no_fp32_gemm"  # the single pass needs fp32-output GEMMs (logits, dW accumulation)
        _warn_once(f"torch {torch.__version__} has no fp32-output addmm for {hidden.dtype} on CUDA: fused_loss "
                   "runs the two-pass path (8NVd, dH from fp32 copies: ~10x slower); docs/kernels.md")
    if why is None:
        try:
            with _on(dev):
                out = _fused(hidden, weight, targets.contiguous(), temperature, ignore_index, with_entropy,
                             per_token, options, need_hidden_grad, need_weight_grad, min(rows, n))
            PATHS["fused.single_pass"] += 1
            return out
        except torch.OutOfMemoryError:
            why = "out_of_memory"  # the block did not fit after all (another stream, fragmentation): two-pass path
        if cuda:
            torch.cuda.empty_cache()
    PATHS[f"fused.two_pass:{why}"] += 1
    logprob, entropy, _, lse = forward(hidden, weight, targets, None, temperature, with_entropy, ignore_index,
                                       check_targets=False)
    loss, a, b, sums = token_loss(logprob, entropy, **per_token, options=options)
    grads = backward(hidden, weight, targets, lse, entropy, a, b, temperature, ignore_index,
                     need_hidden_grad=need_hidden_grad, need_weight_grad=need_weight_grad)
    return loss, sums, *grads, logprob


def _fused(hidden, weight, targets, temperature, ignore_index, with_entropy, per_token, options, need_hidden_grad,
           need_weight_grad, rows):
    n, d = hidden.shape
    vocab = weight.shape[0]
    dev = hidden.device
    f32 = dict(device=dev, dtype=torch.float32)
    inv_temp = 1.0 / temperature
    blocks = math.ceil(n / rows)
    z = torch.empty((rows, vocab), **f32)
    # fp32 inputs: G overwrites the logits in place; 16-bit: G is a 16-bit copy (the GEMMs' operand).
    g = z if hidden.dtype == torch.float32 else torch.empty((rows, vocab), device=dev, dtype=hidden.dtype)
    grad_hidden = torch.empty_like(hidden, memory_format=torch.contiguous_format) if need_hidden_grad else None
    grad_weight = None
    if need_weight_grad:  # one block: dW is one GEMM, in the weight dtype; more: an fp32 accumulator
        grad_weight = torch.empty((vocab, d), device=dev, dtype=weight.dtype if blocks == 1 else torch.float32)
    logprob = torch.empty(n, **f32)
    lse = torch.empty(n, **f32)
    entropy = torch.empty(n, **f32) if with_entropy else None
    loss, sums = None, {}
    interp = _interpreted()
    stats_cfg = configs.INTERPRET_ROW_STATS if interp else configs.ROW_STATS
    grad_cfg = configs.INTERPRET_GRAD_FROM_LOGITS if interp else configs.GRAD_FROM_LOGITS
    stats_warps = {} if interp else {"num_warps": configs.ROW_STATS_NUM_WARPS}
    grad_warps = {} if interp else {"num_warps": configs.GRAD_FROM_LOGITS_NUM_WARPS}
    ignored = targets == ignore_index
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        rb = r1 - r0
        h, y, zb, gb = hidden[r0:r1], targets[r0:r1], z[:rb], g[:rb]
        _matmul(h, weight.t(), zb, False, 1.0, "matmul_logits")  # Z = h·Wᵀ, fp32 [rb, V]
        ent_b = entropy[r0:r1] if with_entropy else lse[r0:r1]
        fused_rows.row_stats_kernel[(_cdiv(rb, stats_cfg["BLOCK_R"]),)](
            zb, y, lse[r0:r1], logprob[r0:r1], ent_b, rb, vocab, zb.stride(0), inv_temp, ignore_index,
            WITH_ENTROPY=with_entropy, **stats_cfg, **stats_warps)
        block_tokens = {k: None if t is None else t[r0:r1] for k, t in per_token.items()}
        block_loss, a, b, block_sums = token_loss(logprob[r0:r1], entropy[r0:r1] if with_entropy else None,
                                                  **block_tokens, options=options)
        loss = block_loss if loss is None else loss + block_loss
        sums = merge_metric_sums(sums, block_sums)
        has_b = b is not None
        ent_g = entropy[r0:r1] if has_b else a
        scale = _grad_scale(a, b, ent_g if has_b else None, temperature, hidden.dtype, ignored[r0:r1])
        n_vtiles = _cdiv(vocab, grad_cfg["BLOCK_V"])
        fused_rows.grad_from_logits_kernel[(_cdiv(rb, grad_cfg["BLOCK_R"]) * n_vtiles,)](
            zb, y, lse[r0:r1], ent_g, a, b if has_b else a, gb, rb, vocab, zb.stride(0), gb.stride(0),
            inv_temp, scale, ignore_index, HAS_B=has_b, **grad_cfg, **grad_warps)
        if grad_hidden is not None:  # dH rows = G·W / S: complete for this block, no accumulation
            _matmul(gb, weight, grad_hidden[r0:r1], False, 1.0 / scale, "matmul_dh")
        if grad_weight is not None:  # dW (+)= Gᵀ·h / S over all vocabulary rows; 0·NaN: ignored rows zeroed
            _matmul(gb.t(), h.masked_fill(ignored[r0:r1, None], 0.0), grad_weight, r0 > 0, 1.0 / scale,
                    "matmul_dw")
    del z, g, zb, gb  # the logits block is dead: the dW cast below needs its memory, not both at once
    if grad_weight is not None and grad_weight.dtype != weight.dtype:
        grad_weight = grad_weight.to(weight.dtype)
    return loss, sums, grad_hidden, grad_weight, logprob


# ----------------------------------------------------------------------------------------- token loss

def token_loss(logprob, entropy, old_logprob, ref_logprob, teacher_logprob, teacher_mask, advantages,
               token_weights, *, options: LossOptions = PLAIN_PPO, block: int | None = None,
               n_programs: int | None = None):
    """-> (loss 0-dim f32, a [N] f32, b [N] f32 | None, metric sums), as seedfast/ops/token_loss.py.

    Metric sums: weight (Σw), clip_frac, ratio_min/ratio_max (±inf without a weighted token), kl (with
    ref_logprob), entropy (with entropy), teacher_weight (Σw·m), gate and opd_term (with teacher_logprob,
    when the gate's inputs are there). opd_mode "advantage": teacher_weight and opd_term (Σw·shift) only;
    "reverse_kl" / "jsd": no teacher term and no teacher sums. b is None when options.entropy_coef == 0.
    old_logprob None: on-policy.
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
    if options.kl_kind not in KL_KINDS:
        raise ValueError(f"kl_kind must be one of {sorted(KL_KINDS)}, got {options.kl_kind!r}")
    if options.gate not in GATES:
        raise ValueError(f"gate must be one of {sorted(GATES)}, got {options.gate!r}")
    if options.kl_coef != 0 and ref_logprob is None:
        raise ValueError("kl_coef != 0 needs ref_logprob")
    if options.entropy_coef != 0 and entropy is None:
        raise ValueError(f"entropy_coef={options.entropy_coef} needs entropy")
    if options.opd_mode not in OPD_MODES:
        raise ValueError(f"opd_mode must be one of {sorted(OPD_MODES)}, got {options.opd_mode!r}")
    # As the torch backend: gate-form OPD terms exist when the gate can be evaluated (gap, or entropy given); the
    # advantage form's whenever there is a teacher; the divergence forms' never (their term is not per token).
    opd_mode = OPD_MODES[options.opd_mode]
    has_opd = teacher_logprob is not None and (
        opd_mode == OPD_ADVANTAGE or (opd_mode == OPD_GATE and (options.gate == "gap" or entropy is not None)))
    if options.opd_coef != 0 and not has_opd and opd_mode != OPD_NONE:
        raise ValueError(f"opd_coef={options.opd_coef} needs teacher_logprob" +
                         ("" if teacher_logprob is None else f" and entropy for gate={options.gate!r}"))
    if options.dual_clip is not None and not options.dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 or None, got {options.dual_clip}")
    _check_device(logprob)

    def f32(t):
        if t is None:
            return None
        return t.detach().to(torch.float32).contiguous()

    lp, ent, old, ref, teacher, tmask, adv, w = (f32(t) for t in (
        logprob, entropy, old_logprob, ref_logprob, teacher_logprob, teacher_mask, advantages, token_weights))
    write_b = options.entropy_coef != 0
    a = torch.empty(n, device=dev, dtype=torch.float32)
    b = torch.empty(n, device=dev, dtype=torch.float32) if write_b else None
    interp = _interpreted()
    block = block or (configs.INTERPRET_TOKEN_LOSS_BLOCK if interp else configs.TOKEN_LOSS_BLOCK)
    programs = n_programs or max(1, min(math.ceil(n / block), 2 * _sm_count(dev)))
    stats = torch.empty((programs, N_STATS), device=dev, dtype=torch.float32)
    with _on(dev):
        token_loss_kernel[(programs,)](
            lp, ent if ent is not None else lp, old, ref if ref is not None else lp,
            teacher if teacher is not None else lp, tmask if tmask is not None else lp, adv, w,
            a, b if write_b else a, stats, n,
            float(options.clip_low), float(options.clip_high), float(options.dual_clip or 0.0),
            float(options.kl_coef), float(options.entropy_coef), float(options.opd_coef), float(options.opd_beta),
            float(options.opd_adv_clip),
            HAS_ENTROPY=ent is not None, HAS_DUAL_CLIP=options.dual_clip is not None,
            KL_KIND=KL_KINDS[options.kl_kind] if ref is not None else KL_NONE,
            HAS_OPD=has_opd, HAS_TMASK=tmask is not None, GATE=GATES[options.gate], OPD_MODE=opd_mode,
            WRITE_B=write_b,
            BLOCK=block,
            **({} if interp else {"num_warps": configs.TOKEN_LOSS_NUM_WARPS}),
        )
    col = dict(zip(STAT_NAMES, stats.unbind(1)))
    sums = {"weight": col["weight"].sum(), "clip_frac": col["clip_frac"].sum(),
            "ratio_min": col["ratio_min"].min(), "ratio_max": col["ratio_max"].max()}
    if ref is not None:
        sums["kl"] = col["kl"].sum()
    if ent is not None:
        sums["entropy"] = col["entropy"].sum()
    if has_opd:
        for key in ("teacher_weight", "gate", "opd_term") if opd_mode == OPD_GATE else ("teacher_weight", "opd_term"):
            sums[key] = col[key].sum()
    return col["loss"].sum(), a, b, sums
