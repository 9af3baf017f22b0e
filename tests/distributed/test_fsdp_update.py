"""One GRPO and one SEED update (each form of its teacher term) under FSDP2 on 2 CPU processes (gloo) equal the same
update in one process: the loss, the gradient norm and every updated weight (fp32, 1e-5). The loss convention
(token-mean over the global token count, gradients summed across ranks) is what makes them equal: with FSDP2's default
gradient averaging the gradients come out halved, i.e. the learning rate would silently shrink with the world size
(docs/scaling.md)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from seedfast.distributed.data import DataParallel, split_whole_groups
from seedfast.distributed.parallelize import apply_fsdp, fsdp_modules, unsharded
from seedfast.model.decoder import build_decoder
from seedfast.runtime.optim import adamw, grad_norm_and_clip
from seedfast.train.update import minibatch_loss_backward
from tests.distributed.dist_helpers import grouped_samples, make_config, run_on_ranks
from tests.distributed.update_helpers import CASES
from tests.distributed.update_helpers import full as _full
from tests.distributed.update_helpers import update_batch as _batch

N_SAMPLES, BUDGET, LR = 12, 48, 1e-2  # a small budget: several micro-batches, more on one rank than the other


def _update(model, samples, case, dp=None):
    opt = adamw(list(model.parameters()), lr=LR, weight_decay=0.01, eps=1e-4)  # as in test_2d_mesh.py
    batch = _batch(samples, case["teacher"])
    loss, metrics = minibatch_loss_backward(model, batch, list(range(len(samples))), case["loss"], use_kl=False,
                                            use_opd=case["use_opd"], temperature=1.1, token_budget=BUDGET, dp=dp)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    norm = grad_norm_and_clip(opt, 1e9)
    opt.step()
    return loss, metrics, norm, grads


def _worker(rank, world, name, average, checkpointing=False, after_rollout=False):
    case = CASES[name]
    torch.manual_seed(0)
    model = build_decoder(make_config("qwen2"), dtype=torch.float32, seed=3)  # tied embeddings, q/k/v bias
    samples = grouped_samples(5, N_SAMPLES)
    ref_model = copy.deepcopy(model)
    ref_loss, ref_metrics, ref_norm, ref_grads = _update(ref_model, samples, case)

    model.gradient_checkpointing = checkpointing  # dist.activation_checkpointing: recomputed inside FSDP2 units
    apply_fsdp(model, init_device_mesh("cpu", (world,)))
    if average:
        for unit in fsdp_modules(model):  # FSDP2's default: the mean over ranks
            unit.set_gradient_divide_factor(float(world))
    if after_rollout:  # as in a run: generation under unsharded() comes before the update
        with unsharded(model):
            ids = torch.as_tensor(samples[0].prompt_ids)
            model(ids, torch.tensor([0, len(ids)], dtype=torch.int32))
    costs = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    mine = split_whole_groups(samples, [s.group_id for s in samples], costs, rank, world)
    assert 0 < len(mine) < len(samples)
    # the advantages of the shared batch (per group, so the same whether computed before or after the split)
    loss, metrics, norm, grads = _update(model, mine, case, dp=DataParallel(rank, world))

    if average:  # the wrong convention: every gradient is 1/world of the one-process gradient
        g = _full(grads["model.layers.0.mlp.up_proj.weight"])
        torch.testing.assert_close(g * world, ref_grads["model.layers.0.mlp.up_proj.weight"], rtol=1e-5, atol=1e-7)
        assert not torch.allclose(g, ref_grads["model.layers.0.mlp.up_proj.weight"], rtol=1e-2, atol=0)
        return
    assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-7)
    assert norm == pytest.approx(ref_norm, rel=1e-5)
    assert metrics.keys() == ref_metrics.keys()
    for k, v in ref_metrics.items():
        assert metrics[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
    if case["use_opd"]:
        assert ref_metrics["opd_term"] != 0.0
    for (n, p), (rn, rp) in zip(model.named_parameters(), ref_model.named_parameters()):
        assert n == rn
        torch.testing.assert_close(_full(p.detach()), rp.detach(), rtol=1e-5, atol=1e-5, msg=n)
    # the weights moved (a test of an update that did nothing would pass the comparison trivially)
    assert not torch.allclose(ref_model.lm_head_weight, build_decoder(make_config("qwen2"), dtype=torch.float32,
                                                                      seed=3).lm_head_weight)


@pytest.mark.parametrize("name", sorted(CASES))
def test_two_rank_fsdp_update_equals_one_process(name):
    run_on_ranks(2, _worker, name, False)


def test_two_rank_fsdp_update_with_activation_checkpointing_equals_one_process_without():
    run_on_ranks(2, _worker, "seed", False, True)


def test_fsdp_default_averaging_would_scale_the_learning_rate_by_one_over_world():
    run_on_ranks(2, _worker, "grpo", True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_two_rank_fsdp_update_after_a_rollout_equals_one_process(name):
    """A rollout under unsharded() must leave FSDP2's root as it found it: a root that reshards after forward hands
    the loss an LM head still sharded over the data-parallel ranks."""
    run_on_ranks(2, _worker, name, False, False, True)
