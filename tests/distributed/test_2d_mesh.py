"""A 2 x 2 mesh (FSDP2 over 2 data-parallel ranks x tensor parallel 2, 4 CPU processes over gloo, tiny model): one
GRPO update (AdamW, gradient clipping) equals the same update in one process: loss, gradient norm, weights."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from seedfast.config import LossConfig
from seedfast.distributed.data import DataParallel, split_whole_groups
from seedfast.distributed.mesh import MESH_DIMS
from seedfast.distributed.parallelize import parallelize_decoder
from seedfast.model.decoder import build_decoder
from seedfast.runtime.optim import adamw, grad_norm_and_clip
from seedfast.train.update import UpdateBatch, minibatch_loss_backward
from tests.distributed.dist_helpers import grouped_samples, make_config, run_on_ranks

LOSS = LossConfig(opd_coef=0.0, entropy_coef=0.01, kl_coef=0.0)


def _step(model, samples, adv, dp=None):
    # eps well above the gradients' rounding (1e-8): the first Adam step is g / (|g| + eps), which for eps = 1e-8 turns
    # rounding noise on a near-zero gradient into a step of lr
    opt = adamw(list(model.parameters()), lr=1e-2, weight_decay=0.01, eps=1e-4)
    loss, metrics = minibatch_loss_backward(model, UpdateBatch(samples, adv, None), list(range(len(samples))), LOSS,
                                            use_kl=False, use_opd=False, temperature=1.0, token_budget=48, dp=dp)
    norm = grad_norm_and_clip(opt, 0.5)  # clips: the norm is a global one
    opt.step()
    return loss, metrics, norm


def _worker(rank, world):
    model = build_decoder(make_config("qwen3", vocab_size=203), dtype=torch.float32, seed=6)
    samples = grouped_samples(11, 12)
    adv = torch.tensor([s.reward for s in samples]) - 0.5
    ref = copy.deepcopy(model)
    ref_loss, ref_metrics, ref_norm = _step(ref, samples, adv)

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=MESH_DIMS)
    parallelize_decoder(model, mesh)
    dp = DataParallel.from_mesh(mesh)
    costs = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    keep = split_whole_groups(list(range(len(samples))), [s.group_id for s in samples], costs, dp.rank, dp.size)
    loss, metrics, norm = _step(model, [samples[i] for i in keep], adv[keep], dp=dp)

    assert ref_norm > 0.5  # the clip is active
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert norm == pytest.approx(ref_norm, rel=1e-5)
    for k, v in ref_metrics.items():
        assert metrics[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
    full = {n: p.detach().full_tensor() for n, p in model.named_parameters()}
    for n, p in ref.named_parameters():
        torch.testing.assert_close(full[n], p.detach(), rtol=1e-5, atol=1e-5, msg=n)


def test_fsdp2_x_tp2_update_equals_one_process():
    run_on_ranks(4, _worker)
