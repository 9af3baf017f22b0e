"""What the update tests of one process against several share (test_fsdp_update.py, the LoRA tests): the loss cases,
the update batch with its GRPO advantages, a sharded tensor made whole, and a tiny adapted decoder with its updates."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from seedfast.config import LossConfig
from seedfast.model.decoder import build_decoder
from seedfast.model.lora import LoRALinear, LoRASpec, add_lora, lora_modules
from seedfast.runtime.optim import adamw, grad_norm_and_clip
from seedfast.train.update import UpdateBatch, minibatch_loss_backward
from tests.distributed.dist_helpers import make_config

CASES = {
    # GRPO, on-policy (ℓold from the update's own forward)
    "grpo": dict(loss=LossConfig(opd_coef=0.0, entropy_coef=0.01, kl_coef=0.0), use_opd=False, teacher=False),
    # SEED: ℓskill from the teacher branches on the prefix KV of the update's forward
    "seed": dict(loss=LossConfig(opd_coef=0.5, opd_beta=2.0, entropy_coef=0.0, kl_coef=0.0), use_opd=True,
                 teacher=True),
    # the signed and the full-vocabulary forms of the teacher term (docs/algorithms.md, 'Forms of the teacher term')
    "seed_advantage": dict(loss=LossConfig(opd_coef=0.5, opd_mode="advantage", entropy_coef=0.0, kl_coef=0.0),
                           use_opd=True, teacher=True),
    "seed_reverse_kl": dict(loss=LossConfig(opd_coef=0.5, opd_mode="reverse_kl", entropy_coef=0.0, kl_coef=0.0),
                            use_opd=True, teacher=True),
}
BUDGET, LR = 48, 1e-2  # a small budget: several micro-batches, more on one rank than the other
LORA_SPEC = LoRASpec(rank=4, alpha=8.0)


def update_batch(samples, teacher: bool) -> UpdateBatch:
    rewards = torch.tensor([s.reward for s in samples])
    groups = torch.tensor([s.group_id for s in samples])
    adv = torch.zeros(len(samples))
    for g in groups.unique():  # GRPO advantages per group, computed before the split (statistics are per group)
        m = groups == g
        adv[m] = (rewards[m] - rewards[m].mean()) / (rewards[m].std() + 1e-6)
    return UpdateBatch(samples, adv, None, teacher_from_forward=teacher)


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def lora_model(dtype: torch.dtype, family: str = "qwen2") -> torch.nn.Module:
    """A tiny decoder in `dtype` (frozen) with fp32 adapters whose B is not zero, so that A has a gradient at once."""
    model = build_decoder(make_config(family), dtype=dtype, seed=3)
    add_lora(model, LORA_SPEC, seed=1)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for m in lora_modules(model).values():
            m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=gen) * 0.05)
    return model


@contextmanager
def as_sharded_layers_compute():
    """Within the block a one-process model's adapted layers compute as sharded ones must (x·Wᵀ plus the adapters'
    products; a DTensor or hooked layer cannot merge its weight, model/lora.py): the comparison is then of the
    sharding, not of two roundings of one function, which AdamW's first step amplifies where a gradient is near 0."""
    merged = LoRALinear._trains_merged
    LoRALinear._trains_merged = lambda self, x: False
    try:
        yield
    finally:
        LoRALinear._trains_merged = merged


def lora_updates(model, samples, case, steps=2, dp=None):
    """`steps` optimizer steps of AdamW over the adapters, each on the same batch; returns the losses, norms and
    the first step's gradients (by name)."""
    opt = adamw([p for p in model.parameters() if p.requires_grad], lr=LR, weight_decay=0.01, eps=1e-4)
    batch = update_batch(samples, case["teacher"])
    losses, norms, grads = [], [], None
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss, _ = minibatch_loss_backward(model, batch, list(range(len(samples))), case["loss"], use_kl=False,
                                          use_opd=case["use_opd"], temperature=1.1, token_budget=BUDGET, dp=dp)
        if grads is None:
            grads = {n: full(p.grad).clone() for n, p in model.named_parameters() if p.grad is not None}
        norms.append(grad_norm_and_clip(opt, 1e9))
        opt.step()
        losses.append(loss)
    return losses, norms, grads, opt
