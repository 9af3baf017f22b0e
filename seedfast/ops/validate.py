"""Input checks of the public ops: one clear error naming the argument, before any heavy work."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from seedfast.algo import losses
from seedfast.algo.losses import LossOptions
from seedfast.sampling_params import check_scoring_temperature

_INDEX_DTYPES = (torch.int64, torch.int32)


def _tensor(func: str, name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{func}: {name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _floating(func: str, name: str, x: torch.Tensor) -> None:
    if not x.is_floating_point():
        raise ValueError(f"{func}: {name} must be a floating-point tensor, got dtype {x.dtype}")


def _same_device(func: str, name: str, x: torch.Tensor, device: torch.device) -> None:
    if x.device != device:
        raise ValueError(f"{func}: {name} is on {x.device} but hidden is on {device}; they must match")


def _number(func: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{func}: {name} must be a finite number, got {value!r}")
    return float(value)


def check_linear_inputs(func: str, hidden: object, weight: object, targets: object, teacher_hidden: object,
                        temperature: object, ignore_index: object) -> torch.Tensor:
    """Checks the inputs shared by linear_logprob and fused_loss; returns targets as int64."""
    hidden = _tensor(func, "hidden", hidden)
    weight = _tensor(func, "weight", weight)
    targets = _tensor(func, "targets", targets)
    _floating(func, "hidden", hidden)
    _floating(func, "weight", weight)
    if hidden.dim() != 2:
        raise ValueError(f"{func}: hidden must be [N, d] (2-D), got shape {tuple(hidden.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"{func}: weight must be [V, d] with d = hidden.shape[1] = {hidden.shape[1]}, "
                         f"got shape {tuple(weight.shape)}")
    if weight.shape[0] == 0:
        raise ValueError(f"{func}: weight has an empty vocabulary (shape {tuple(weight.shape)})")
    if targets.dtype not in _INDEX_DTYPES:
        raise ValueError(f"{func}: targets must be an int64 (or int32) tensor, got dtype {targets.dtype}")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"{func}: targets must be [N] with N = hidden.shape[0] = {hidden.shape[0]}, "
                         f"got shape {tuple(targets.shape)}")
    _same_device(func, "weight", weight, hidden.device)
    _same_device(func, "targets", targets, hidden.device)
    if teacher_hidden is not None:
        teacher_hidden = _tensor(func, "teacher_hidden", teacher_hidden)
        _floating(func, "teacher_hidden", teacher_hidden)
        if teacher_hidden.shape != hidden.shape:
            raise ValueError(f"{func}: teacher_hidden has shape {tuple(teacher_hidden.shape)} but hidden has "
                             f"shape {tuple(hidden.shape)}; they must match")
        _same_device(func, "teacher_hidden", teacher_hidden, hidden.device)
    check_scoring_temperature(temperature, func)
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise ValueError(f"{func}: ignore_index must be an int, got {ignore_index!r}")
    targets = targets.long()
    check_target_range(func, targets, weight.shape[0], ignore_index)
    return targets


def check_target_range(func: str, targets: torch.Tensor, vocab: int, ignore_index: int) -> None:
    """Every target is in [0, vocab) or ignore_index, else one ValueError naming the first offender.

    The one target-range check of seedfast.ops (an out-of-range id would silently give logprob = -lse):
    one device→host sync when all is well. The public ops run it here and call the backends with
    check_targets=False, so a call syncs for it once whatever the backend."""
    if not targets.numel():
        return
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= vocab))
    if bool(bad.any()):
        first = int(bad.nonzero()[0, 0])
        raise ValueError(f"{func}: targets[{first}] = {int(targets[first])} is outside the vocabulary "
                         f"[0, {vocab}) and is not ignore_index={ignore_index}")


def check_per_token(func: str, name: str, x: object, n: int, device: torch.device, *, floating: bool = True,
                    required: bool = True) -> torch.Tensor | None:
    """A per-token [N] tensor (float, or any dtype for masks); None allowed when not required."""
    if x is None:
        if required:
            raise ValueError(f"{func}: {name} is required")
        return None
    x = _tensor(func, name, x)
    if floating:
        _floating(func, name, x)
    if x.shape != (n,):
        raise ValueError(f"{func}: {name} must be [N] with N = hidden.shape[0] = {n}, got shape {tuple(x.shape)}")
    _same_device(func, name, x, device)
    return x


def check_finite(func: str, name: str, x: torch.Tensor) -> None:
    """Every entry of the per-token [N] tensor x is finite, else one ValueError counting the bad ones and naming the
    first one's row (one device→host sync when all is well)."""
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        count, first = int(bad.sum()), int(bad.nonzero()[0, 0])
        raise ValueError(f"{func}: {name} holds {count} non-finite value{'s' if count != 1 else ''} "
                         f"(first at row {first})")


def check_loss_options(func: str, options: object, *, has_ref: bool, has_teacher: bool) -> LossOptions:
    """The loss options checked against the per-token inputs there are; returns them with every number a float."""
    if not isinstance(options, LossOptions):
        raise TypeError(f"{func}: options must be a seedfast.algo.losses.LossOptions, got {type(options).__name__}")
    if options.kl_kind not in losses.KL_KINDS:
        raise ValueError(f"{func}: unknown kl_kind={options.kl_kind!r}; allowed values: "
                         f"{', '.join(map(repr, losses.KL_KINDS))}")
    if options.gate not in losses.GATES:
        raise ValueError(f"{func}: unknown gate={options.gate!r}; allowed values: "
                         f"{', '.join(map(repr, losses.GATES))}")
    if options.opd_mode not in losses.OPD_MODES:
        raise ValueError(f"{func}: unknown opd_mode={options.opd_mode!r}; allowed values: "
                         f"{', '.join(map(repr, losses.OPD_MODES))}")
    for name in ("kl_coef", "entropy_coef", "opd_coef", "opd_beta"):
        _number(func, name, getattr(options, name))
    if not _number(func, "opd_adv_clip", options.opd_adv_clip) > 0:
        raise ValueError(f"{func}: opd_adv_clip must be > 0, got {options.opd_adv_clip}")
    if not 0.0 <= _number(func, "opd_jsd_beta", options.opd_jsd_beta) <= 1.0:
        raise ValueError(f"{func}: opd_jsd_beta must be in [0, 1], got {options.opd_jsd_beta}")
    if not 0.0 <= _number(func, "clip_low", options.clip_low) < 1.0:
        raise ValueError(f"{func}: clip_low must be in [0, 1), got {options.clip_low}")
    if _number(func, "clip_high", options.clip_high) < 0.0:
        raise ValueError(f"{func}: clip_high must be >= 0, got {options.clip_high}")
    if options.dual_clip is not None and _number(func, "dual_clip", options.dual_clip) <= 1.0:
        raise ValueError(f"{func}: dual_clip must be > 1 (or None to turn it off), got {options.dual_clip}")
    if options.kl_coef != 0 and not has_ref:
        raise ValueError(f"{func}: kl_coef={options.kl_coef} needs ref_logprob, which is None")
    if options.opd_coef != 0 and options.opd_mode not in losses.DIVERGENCE_MODES and not has_teacher:
        raise ValueError(f"{func}: opd_coef={options.opd_coef} needs teacher_logprob, which is None")
    floats = {name: float(getattr(options, name))
              for name in ("clip_low", "clip_high", "kl_coef", "entropy_coef", "opd_coef", "opd_beta", "opd_adv_clip",
                           "opd_jsd_beta")}
    return replace(options, dual_clip=None if options.dual_clip is None else float(options.dual_clip), **floats)
