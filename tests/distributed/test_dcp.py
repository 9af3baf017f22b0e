"""Distributed checkpoints (DCP): a checkpoint written by 2 FSDP2 ranks resumes on 1 process (no process group)
and on 4 ranks, and the next update's loss, gradient norm and weights equal an uninterrupted one-process run; the
scheduler and trainer state come back too. The HF export of the sharded policy loads in transformers and gives
the one-process logits."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import transformers
from torch.distributed.device_mesh import init_device_mesh

from seedfast.config import LossConfig
from seedfast.distributed.checkpoint import export_hf
from seedfast.distributed.data import DataParallel, split_whole_groups
from seedfast.distributed.parallelize import apply_fsdp
from seedfast.model.decoder import build_decoder
from seedfast.runtime.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from seedfast.runtime.optim import adamw, grad_norm_and_clip
from seedfast.scoring.packing import pack_single
from seedfast.train.update import UpdateBatch, minibatch_loss_backward
from tests.distributed.dist_helpers import grouped_samples, make_config, run_on_ranks

LOSS = LossConfig(opd_coef=0.0, entropy_coef=0.01, kl_coef=0.0)


def _fresh():
    model = build_decoder(make_config("qwen2"), dtype=torch.float32, seed=8)
    return model


def _optim(model):
    opt = adamw(list(model.parameters()), lr=1e-2, weight_decay=0.01, eps=1e-4)  # eps: see test_2d_mesh.py
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / 2)  # step 2 runs at twice step 1's lr
    return opt, sched


def _batch(step):
    samples = grouped_samples(20 + step, 12)
    return samples, torch.tensor([s.reward for s in samples]) - 0.4


def _update(model, opt, sched, step, dp=None):
    samples, adv = _batch(step)
    if dp is not None:
        costs = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
        keep = split_whole_groups(list(range(len(samples))), [s.group_id for s in samples], costs, dp.rank, dp.size)
        samples, adv = [samples[i] for i in keep], adv[keep]
    opt.zero_grad(set_to_none=True)
    loss, _ = minibatch_loss_backward(model, UpdateBatch(samples, adv, None), list(range(len(samples))), LOSS,
                                      use_kl=False, use_opd=False, temperature=1.0, token_budget=4096, dp=dp)
    norm = grad_norm_and_clip(opt, 1e9)
    opt.step()
    sched.step()
    return loss, norm


def _sharded(world):
    model = _fresh()
    apply_fsdp(model, init_device_mesh("cpu", (world,)))
    opt, sched = _optim(model)
    return model, opt, sched, DataParallel(torch.distributed.get_rank(), world)


def _save_on_ranks(rank, world, folder):
    model, opt, sched, dp = _sharded(world)
    _update(model, opt, sched, 0, dp)
    save_checkpoint(f"{folder}/ckpt", 1, model, opt, sched, {"bad_steps": 0})
    export_hf(model, f"{folder}/hf")


def _resume_on_ranks(rank, world, folder):
    model, opt, sched, dp = _sharded(world)
    state = load_checkpoint(latest_checkpoint(f"{folder}/ckpt"), model, opt, sched)
    assert state["step"] == 1
    loss, norm = _update(model, opt, sched, 1, dp)
    full = {n: p.detach().full_tensor() for n, p in model.named_parameters()}
    if rank == 0:
        torch.save({"loss": loss, "norm": norm, "weights": full, "lr": sched.get_last_lr()},
                   f"{folder}/resumed_{world}.pt")


def _check(result, ref_loss, ref_norm, ref_model, ref_lr):
    # the optimizer's param groups carry this step's lr; the scheduler decides the next one
    assert result["lr"] == pytest.approx(ref_lr)
    assert result["loss"] == pytest.approx(ref_loss, rel=1e-5)
    assert result["norm"] == pytest.approx(ref_norm, rel=1e-5)
    for n, p in ref_model.named_parameters():
        torch.testing.assert_close(result["weights"][n], p.detach(), rtol=1e-5, atol=1e-5, msg=n)


def test_saved_on_2_ranks_resumes_on_1_and_on_4_and_exports_hf(tmp_path):
    # the uninterrupted run, in this process
    ref = _fresh()
    opt, sched = _optim(ref)
    _update(ref, opt, sched, 0)
    after_one = copy.deepcopy(ref)
    ref_loss, ref_norm = _update(ref, opt, sched, 1)
    ref_lr = sched.get_last_lr()

    run_on_ranks(2, _save_on_ranks, str(tmp_path))
    ckpt = latest_checkpoint(tmp_path / "ckpt")
    assert ckpt.name == "step_1" and sorted(p.name for p in ckpt.glob("rng_rank*.pt")) == ["rng_rank0.pt",
                                                                                           "rng_rank1.pt"]
    assert json.loads((ckpt / "trainer_state.json").read_text()) == {"step": 1, "bad_steps": 0}

    # resumed in one process without a process group: DCP gathers the shards into the plain model
    model = _fresh()
    opt1, sched1 = _optim(model)
    assert load_checkpoint(ckpt, model, opt1, sched1)["step"] == 1
    loss, norm = _update(model, opt1, sched1, 1)
    _check({"loss": loss, "norm": norm, "weights": dict(model.named_parameters()), "lr": sched1.get_last_lr()},
           ref_loss, ref_norm, ref, ref_lr)

    run_on_ranks(4, _resume_on_ranks, str(tmp_path))
    _check(torch.load(tmp_path / "resumed_4.pt"), ref_loss, ref_norm, ref, ref_lr)

    # the HF export of the sharded policy (after step 1) in transformers: the one-process logits
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    samples, _ = _batch(0)
    ids = pack_single(samples[:1]).input_ids
    with torch.no_grad():
        logits = hf(ids[None]).logits[0]
        expected = after_one(ids, torch.tensor([0, len(ids)], dtype=torch.int32)) @ after_one.lm_head_weight.T
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
