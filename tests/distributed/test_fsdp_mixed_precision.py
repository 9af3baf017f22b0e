"""model.dtype over optim.master_dtype, and dist.reduce_dtype (FSDP2 mixed precision), set through the config as
`seedfast train` sets them (runtime/setup.py shard_policy): fp32 master weights and optimizer states, bf16 weights in
forward and backward, gradients reduced across ranks in fp32; the update stays close to the fp32 one (bf16 rounding
only)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from seedfast.config import LossConfig, load_config
from seedfast.distributed.data import split_whole_groups
from seedfast.model.decoder import build_decoder
from seedfast.runtime.setup import shard_policy
from seedfast.train.update import UpdateBatch, minibatch_loss_backward
from tests.distributed.dist_helpers import grouped_samples, make_config, run_on_ranks

LOSS = LossConfig(opd_coef=0.0, entropy_coef=0.0, kl_coef=0.0)


def _loss_backward(model, samples, dp=None) -> float:
    adv = torch.tensor([s.reward - 0.5 for s in samples])
    batch = UpdateBatch(samples, adv, None)
    loss, _ = minibatch_loss_backward(model, batch, list(range(len(samples))), LOSS, use_kl=False, use_opd=False,
                                      temperature=1.0, token_budget=64, dp=dp)
    return loss


def _worker(rank, world, param_dtype, reduce_dtype):
    model = build_decoder(make_config("qwen2"), dtype=torch.float32, seed=3)
    samples = grouped_samples(5, 12)
    ref = copy.deepcopy(model)
    ref_loss = _loss_backward(ref, samples)

    cfg = load_config(None, ["dist.strategy=fsdp", f"model.dtype={param_dtype}", "optim.master_dtype=fp32",
                             f"dist.reduce_dtype={reduce_dtype}", "rollout.tasks_per_batch=2"])
    dp = shard_policy(cfg, model, torch.device("cpu"))
    seen_weights: list[torch.dtype] = []
    model.model.layers[0].mlp.register_forward_pre_hook(
        lambda mod, args: seen_weights.append(mod.up_proj.weight.dtype))
    reduced: list[torch.dtype] = []
    originals = {}
    for name in ("reduce_scatter_tensor", "reduce_scatter_single"):  # what FSDP2 reduces gradients with
        if hasattr(dist, name):
            originals[name] = getattr(dist, name)

            def spy(*args, _f=originals[name], **kwargs):
                reduced.append((kwargs.get("input") if "input" in kwargs else args[1]).dtype)
                return _f(*args, **kwargs)

            setattr(dist, name, spy)
    try:
        mine = split_whole_groups(samples, [s.group_id for s in samples],
                                  [len(s.prompt_ids) + len(s.response_ids) for s in samples], rank, world)
        loss = _loss_backward(model, mine, dp=dp)
    finally:
        for name, f in originals.items():
            setattr(dist, name, f)

    want_param = {"bf16": torch.bfloat16, "fp32": torch.float32}[param_dtype]
    want_reduce = {"bf16": torch.bfloat16, "fp32": torch.float32}[reduce_dtype]
    assert seen_weights and set(seen_weights) == {want_param}  # the gathered weights the forward computes with
    assert reduced and set(reduced) == {want_reduce}  # the gradients' reduce-scatter across ranks
    for name, p in model.named_parameters():  # master weights and their gradients stay in optim.master_dtype
        assert p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32, name
    assert loss == pytest.approx(ref_loss, rel=3e-2, abs=1e-3)  # bf16 rounding of the forward only
    g = model.model.layers[0].mlp.up_proj.weight.grad.full_tensor()
    g_ref = ref.model.layers[0].mlp.up_proj.weight.grad
    cos = torch.nn.functional.cosine_similarity(g.flatten(), g_ref.flatten(), dim=0)
    assert cos > 0.99, f"bf16 gradient points elsewhere than the fp32 one (cosine {cos:.4f})"


def test_bf16_params_with_fp32_gradient_reduction():
    run_on_ranks(2, _worker, "bf16", "fp32")


def test_bf16_reduction_is_what_the_config_asks_for():
    # the spy's control: the same run asked to reduce in bf16 shows bf16 at the reduce-scatter
    run_on_ranks(2, _worker, "bf16", "bf16")
