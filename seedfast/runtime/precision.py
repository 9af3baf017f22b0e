"""The precision of training, decided here for every command: the trained weights and AdamW's states in
optim.master_dtype (fp32 unless a config asks otherwise), the math in model.dtype (docs/scaling.md, 'Precision').

Why fp32 master weights: at the recipes' lr (1e-6) an Adam step moves a weight by about lr, far below half a bf16
ulp of a typical weight (|w| ~ 0.02: ulp 1.2e-4), so a bf16 weight would not move at all (measured: 1.9% of bf16
weights changed over 10 steps, 99.99% in fp32). verl and torchtitan keep fp32 masters for the same reason.

How, by strategy:
  one process    the module that computes holds model.dtype parameters; `MasterWeights` keeps their fp32 copies.
                 Gradients are moved into the copies as they accumulate (in fp32 across micro-batches), the
                 optimizer steps the copies, and each step is published back to the module (apex's "O2",
                 Megatron's fp16 optimizer). The module's code is unchanged: no autocast, so the sampler, the
                 KV caches, the fused log-prob ops and flash-attn see one dtype.
  dist.strategy=fsdp   the sharded parameters are the masters; FSDP2's MixedPrecisionPolicy gathers them in
                 model.dtype and reduces gradients in dist.reduce_dtype (distributed/parallelize.py).
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any

import torch

# model.dtype / optim.master_dtype / dist.reduce_dtype -> torch dtype: the one map
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    """compute: model.dtype (forward and backward, rollout, export); master: optim.master_dtype (the trained
    weights and AdamW's states); reduce: dist.reduce_dtype (gradients across ranks)."""

    compute: torch.dtype
    master: torch.dtype
    reduce: torch.dtype

    @property
    def mixed(self) -> bool:
        """The module computes in a dtype below its masters'."""
        return self.compute != self.master

    @property
    def low_precision_master(self) -> bool:
        return self.master != torch.float32


def precision_of(cfg: Any) -> Precision:
    """The run's precision from model.dtype, optim.master_dtype and dist.reduce_dtype."""
    return Precision(compute=DTYPES[cfg.model.dtype], master=DTYPES[cfg.optim.master_dtype],
                     reduce=DTYPES[cfg.dist.reduce_dtype])


class MasterWeights:
    """The master weights of a one-process policy that computes in a lower dtype (module docstring).

    `master` is the module whose parameters the optimizer steps and checkpoints save; `compute` is a copy of it in
    `compute_dtype` that runs every forward and backward. Build the optimizer over `master.parameters()` and
    `attach` it."""

    def __init__(self, master: torch.nn.Module, compute_dtype: torch.dtype):
        self.master = master
        # the parameters are cast one at a time (never a second full-precision model in memory)
        memo: dict[int, Any] = {id(p): torch.nn.Parameter(p.detach().to(compute_dtype), requires_grad=p.requires_grad)
                                for p in master.parameters()}
        self.compute = copy.deepcopy(master, memo).to(compute_dtype)
        self._pairs = list(zip(self.compute.parameters(), master.parameters(), strict=True))
        for low, high in self._pairs:
            if low.requires_grad:
                low.register_post_accumulate_grad_hook(_move_grad_into(high))

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """After every step of `optimizer` (over master.parameters()), the compute module gets the new weights."""
        owned = {id(p) for _, p in self._pairs}
        stepped = [p for g in optimizer.param_groups for p in g["params"]]
        if not stepped or any(id(p) not in owned for p in stepped):
            raise ValueError("MasterWeights.attach: the optimizer must step the master module's parameters")
        optimizer.register_step_post_hook(lambda *_: self.publish())

    @torch.no_grad()
    def publish(self) -> None:
        """Copy the master weights into the compute module (rounded to its dtype), e.g. after a step or a resume."""
        for low, high in self._pairs:
            low.copy_(high)


def _move_grad_into(master_param: torch.Tensor) -> Any:
    def hook(param: torch.Tensor) -> None:
        grad = param.grad.to(master_param.dtype)
        if master_param.grad is None:
            master_param.grad = grad
        else:
            master_param.grad.add_(grad)
        param.grad = None

    return hook


def trained_parameters(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameters `optimizer` steps (the masters, when there are master copies)."""
    return [p for g in optimizer.param_groups for p in g["params"]]


class RoundingMonitor:
    """The share of an optimizer step's updates that round away: among a fixed sample of each parameter's elements
    whose gradient is nonzero, those the step left unchanged. Kept when the master weights are low precision
    (optim.master_dtype bf16/fp16), where it is the measure of a silent failure; fp32 masters read ~0."""

    def __init__(self, optimizer: torch.optim.Optimizer, sample: int = 4096, warn_as: str = "optim.master_dtype"):
        self.sample = sample
        self.warn_as = warn_as
        self.last: float | None = None
        self._before: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._warned = False
        optimizer.register_step_pre_hook(self._snapshot)
        optimizer.register_step_post_hook(self._compare)

    def _snapshot(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        self._before = []
        for p in trained_parameters(optimizer):
            if p.grad is None:
                continue
            flat, grad = _local(p).reshape(-1), _local(p.grad).reshape(-1)
            idx = torch.arange(0, flat.numel(), max(1, flat.numel() // self.sample), device=flat.device)
            moving = grad[idx] != 0
            self._before.append((p, idx[moving], flat[idx[moving]].clone()))

    def _compare(self, *_: Any) -> None:
        unchanged = total = 0
        for p, idx, before in self._before:
            after = _local(p).reshape(-1)[idx]
            unchanged += int((after == before).sum())
            total += idx.numel()
        self._before = []
        if not total:
            return
        self.last = unchanged / total
        if not self._warned:
            self._warned = True
            warnings.warn(f"{self.warn_as}: {self.last:.1%} of this optimizer step's updates rounded away (weights "
                          "with a nonzero gradient left unchanged): low-precision master weights do not learn at a "
                          "small lr; keep optim.master_dtype=fp32 (docs/scaling.md, 'Precision')", RuntimeWarning,
                          stacklevel=2)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t
