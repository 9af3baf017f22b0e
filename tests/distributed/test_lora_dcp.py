"""A sharded LoRA checkpoint (DCP, 2 FSDP2 gloo ranks): its dcp/ folder holds the adapters and their AdamW states and
no weight of the frozen base (about 3 x the adapters' fp32 bytes), lora_base.json names and hashes the base; it loads
back bit for bit on 2 ranks, reshards into one process without a process group, where the next update equals the
uninterrupted one-process run, and a different base is refused with the one CheckpointError."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.device_mesh import init_device_mesh

from seedfast.distributed.data import DataParallel, split_whole_groups
from seedfast.distributed.parallelize import apply_fsdp
from seedfast.model.lora import adapter_state_dict, base_state_dict, is_adapter_name
from seedfast.runtime.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from seedfast.runtime.optim import adamw, grad_norm_and_clip
from seedfast.train.update import minibatch_loss_backward
from tests.distributed.dist_helpers import grouped_samples, run_on_ranks
from tests.distributed.update_helpers import CASES, lora_model
from tests.distributed.update_helpers import full as _full
from tests.distributed.update_helpers import update_batch as _batch

BASE = {"path": "/models/base", "sha256": "ab" * 32}
CASE = CASES["grpo"]


def _fresh():
    model = lora_model(torch.float32)
    model.lora_base = dict(BASE)
    return model


def _optim(model):
    opt = adamw([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.01, eps=1e-4)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / 2)


def _update(model, opt, sched, step, dp=None):
    samples = grouped_samples(30 + step, 12)
    if dp is not None:
        costs = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
        samples = split_whole_groups(samples, [s.group_id for s in samples], costs, dp.rank, dp.size)
    opt.zero_grad(set_to_none=True)
    loss, _ = minibatch_loss_backward(model, _batch(samples, False), list(range(len(samples))), CASE["loss"],
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


def _states(model, opt):
    """The adapters and their AdamW states as whole tensors, by parameter name."""
    names = {id(p): n for n, p in model.named_parameters()}
    adapters = {n: _full(t).clone() for n, t in adapter_state_dict(model).items()}
    moments = {f"{names[id(p)]}.{k}": _full(v).clone() for p, s in opt.state.items() for k, v in s.items()
               if k != "step"}
    return adapters, moments


def _save_on_ranks(rank, world, folder):
    model, opt, sched, dp = _sharded(world)
    _update(model, opt, sched, 0, dp)
    save_checkpoint(f"{folder}/ckpt", 1, model, opt, sched, {"bad_steps": 0})
    adapters, moments = _states(model, opt)
    if rank == 0:
        torch.save({"adapters": adapters, "moments": moments}, f"{folder}/saved.pt")


def _reload_on_ranks(rank, world, folder):
    model, opt, sched, _ = _sharded(world)
    assert load_checkpoint(latest_checkpoint(f"{folder}/ckpt"), model, opt, sched)["step"] == 1
    adapters, moments = _states(model, opt)
    saved = torch.load(f"{folder}/saved.pt")
    assert adapters.keys() == saved["adapters"].keys() and moments.keys() == saved["moments"].keys()
    for n, t in {**adapters, **moments}.items():
        assert torch.equal(t, {**saved["adapters"], **saved["moments"]}[n]), n
    start = _fresh()
    for n, t in base_state_dict(model).items():  # the base is the one this rank built, untouched by the load
        assert torch.equal(_full(t), base_state_dict(start)[n]), n


def test_a_sharded_lora_checkpoint_holds_the_adapters_reloads_and_reshards_to_one_process(tmp_path):
    ref = _fresh()
    opt, sched = _optim(ref)
    _update(ref, opt, sched, 0)
    ref_loss, ref_norm = _update(ref, opt, sched, 1)

    run_on_ranks(2, _save_on_ranks, str(tmp_path))
    ckpt = latest_checkpoint(tmp_path / "ckpt")
    assert json.loads((ckpt / "lora_base.json").read_text()) == BASE

    # dcp/ holds the adapters and AdamW's two moments of each, and nothing of the base
    meta = FileSystemReader(str(ckpt / "dcp")).read_metadata().state_dict_metadata
    model_keys = {k.removeprefix("model.") for k in meta if k.startswith("model.")}
    assert model_keys == set(adapter_state_dict(ref))
    assert not any(not is_adapter_name(k.rsplit(".", 1)[0]) for k in meta if k.startswith("optimizer.state."))
    # the tensors' elements: the adapters and two fp32 moments each, plus AdamW's step counts (one per tensor)
    adapter_bytes = sum(t.numel() * 4 for t in adapter_state_dict(ref).values())
    elements = sum(c.sizes.numel() for md in meta.values() if isinstance(md, TensorStorageMetadata) for c in md.chunks)
    assert elements * 4 == 3 * adapter_bytes + 4 * len(adapter_state_dict(ref))
    # on disk: those bytes and DCP's framing of each stored piece (torch.save's, about 1.6 KB: a real model's
    # adapters dwarf it; this tiny model's base is smaller than that framing)
    stored = FileSystemReader(str(ckpt / "dcp")).read_metadata().storage_data
    dcp_bytes = sum(f.stat().st_size for f in (ckpt / "dcp").iterdir() if f.suffix == ".distcp")
    assert 3 * adapter_bytes < dcp_bytes < 3 * adapter_bytes + 2048 * len(stored), (dcp_bytes, adapter_bytes)

    run_on_ranks(2, _reload_on_ranks, str(tmp_path))

    # resharded into one process without a process group: the next update is the uninterrupted run's
    model = _fresh()
    opt1, sched1 = _optim(model)
    assert load_checkpoint(ckpt, model, opt1, sched1)["step"] == 1
    loss, norm = _update(model, opt1, sched1, 1)
    assert loss == pytest.approx(ref_loss, rel=1e-5) and norm == pytest.approx(ref_norm, rel=1e-5)
    assert sched1.get_last_lr() == pytest.approx(sched.get_last_lr())
    for (n, p), (_, rp) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.detach(), rp.detach(), rtol=1e-5, atol=1e-6, msg=n)

    # onto another base: one CheckpointError naming both; onto a model without LoRA: refused too
    other = _fresh()
    other.lora_base = {"path": "/models/other", "sha256": "cd" * 32}
    with pytest.raises(CheckpointError, match=r"adapts the base /models/base \(sha256 ababab.*this run's base is "
                                              r"/models/other"):
        load_checkpoint(ckpt, other, *_optim(other))
    full = copy.deepcopy(_fresh())
    del full.lora_spec
    with pytest.raises(CheckpointError, match="holds LoRA adapters; this run has no LoRA"):
        load_checkpoint(ckpt, full)
