"""Precision that learns (runtime/precision.py, docs/scaling.md 'Precision'): at every shipped GPU recipe's lr and
precision policy, one RL update moves >= 99% of the weights that received a nonzero gradient; pure bf16 master
weights (the control) do not, and the run says so. The master-weight mechanics against hand-computed references."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from seedfast.config import load_config
from seedfast.model import load_hf, save_hf
from seedfast.model.decoder import build_decoder
from seedfast.runtime.optim import grad_norm_and_clip
from seedfast.runtime.precision import MasterWeights, trained_parameters
from seedfast.runtime.setup import load_trainable_policy, rl_optimizer, shard_policy, watch_precision
from seedfast.train.update import UpdateBatch, minibatch_loss_backward
from tests.distributed.dist_helpers import grouped_samples, make_config

ROOT = Path(__file__).resolve().parents[2]
GPU_RECIPES = sorted((ROOT / "configs").glob("qwen*.yaml"))
BAR = 0.99  # share of the weights with a nonzero gradient that one update must move


@contextmanager
def one_rank_group():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _recipe(path: Path, tmp_path: Path, *overrides: str):
    """The recipe's lr, optimizer and precision settings on a tiny bf16 HF policy (as released checkpoints are)."""
    policy = build_decoder(make_config("qwen2", num_hidden_layers=1), dtype=torch.float32, seed=3)
    save_hf(policy.to(torch.bfloat16), tmp_path / "policy")
    cfg = load_config(str(path), [f"model.path={tmp_path / 'policy'}", "model.attn_backend=sdpa",
                                  "rollout.engine=own", "trainer.device=cpu", "rollout.tasks_per_batch=1",
                                  # one rank here: the tensor-parallel split does not change the precision path
                                  "dist.tp=1", "dist.dp_shard=null",
                                  f"run.out_dir={tmp_path}", *overrides])
    return cfg


def _one_update(cfg, tmp_path: Path) -> tuple[float, object]:
    """One RL update through the trainer's own builders; returns (share of the nonzero-gradient master weights that
    moved, the rounding monitor or None)."""
    policy, trained, masters = load_trainable_policy(cfg, Path(cfg.model.path), torch.device("cpu"))
    policy.gradient_checkpointing = cfg.dist.activation_checkpointing
    dp = shard_policy(cfg, policy, torch.device("cpu"))
    optimizer, scheduler = rl_optimizer(cfg, trained)
    rounding = watch_precision(cfg, optimizer, masters)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(cfg.optim.lr)  # the recipe's lr at this step
    samples = grouped_samples(5, 12)
    adv = torch.tensor([s.reward - 0.5 for s in samples])
    before = [_full(p).detach().clone() for p in trained_parameters(optimizer)]
    minibatch_loss_backward(policy, UpdateBatch(samples, adv, None), list(range(len(samples))), cfg.loss,
                            use_kl=False, use_opd=False, temperature=1.0, token_budget=4096, dp=dp)
    grad_norm_and_clip(optimizer, cfg.optim.grad_clip)
    grads = [_full(p.grad).clone() for p in trained_parameters(optimizer)]
    optimizer.step()
    after = [_full(p).detach() for p in trained_parameters(optimizer)]
    moving = torch.cat([(g != 0).flatten() for g in grads])
    moved = torch.cat([(a != b).flatten() for a, b in zip(after, before)])
    assert int(moving.sum()) > 1000
    if masters is not None:  # the module that computes got the step, rounded to its dtype
        for low, high in zip(policy.parameters(), masters.master.parameters()):
            assert torch.equal(low, high.to(low.dtype))
    return float(moved[moving].float().mean()), rounding


@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=lambda p: p.stem)
def test_every_gpu_recipe_trains_fp32_master_weights_that_move_at_its_lr(recipe, tmp_path):
    cfg = _recipe(recipe, tmp_path)
    assert cfg.model.dtype == "bf16" and cfg.optim.master_dtype == "fp32" and cfg.optim.lr <= 1e-6
    if cfg.dist.strategy == "fsdp":  # FSDP2 mixed precision over fp32 sharded masters, on a 1-rank group
        with one_rank_group():
            moved, rounding = _one_update(cfg, tmp_path)
    else:  # one process: a bf16 module that computes, fp32 master copies
        moved, rounding = _one_update(cfg, tmp_path)
    assert rounding is None
    assert moved >= BAR, f"{recipe.name}: only {moved:.2%} of the weights with a gradient moved"


def test_pure_bf16_master_weights_do_not_learn_at_the_recipes_lr_and_say_so(tmp_path):
    """The control: the same update with the trained weights themselves in bf16 (the shipped recipes before)."""
    cfg = _recipe(ROOT / "configs/qwen2.5-3b_alfworld.yaml", tmp_path, "optim.master_dtype=bf16")
    with pytest.warns(RuntimeWarning, match=r"optim.master_dtype: .*% of this optimizer step's updates rounded"):
        moved, rounding = _one_update(cfg, tmp_path)
    assert moved < 0.5, f"{moved:.2%} of bf16 weights moved at lr {cfg.optim.lr}"
    # the monitor's sample reads what the whole tensors show
    assert rounding.last == pytest.approx(1 - moved, abs=0.05)


def test_master_weights_compute_in_bf16_and_step_in_fp32(tmp_path):
    master = build_decoder(make_config("llama"), dtype=torch.float32, seed=1)
    save_hf(master, tmp_path / "p")
    masters = MasterWeights(master, torch.bfloat16)
    low = masters.compute
    # the compute copy is the model loaded in bf16
    reference = load_hf(tmp_path / "p", dtype=torch.bfloat16)
    for (name, a), b in zip(low.state_dict().items(), reference.state_dict().values()):
        assert a.dtype == b.dtype and torch.equal(a, b), name
    ids = torch.randint(0, 64, (10,))
    cu = torch.tensor([0, 10], dtype=torch.int32)
    assert torch.equal(low(ids, cu), reference(ids, cu))

    # gradients land in the masters in fp32, summed over backward passes; the module keeps none
    w = master.model.layers[0].mlp.up_proj.weight
    reference(ids, cu).float().square().mean().backward()
    one_pass = reference.model.layers[0].mlp.up_proj.weight.grad  # bf16, what one backward gives
    for _ in range(2):
        low(ids, cu).float().square().mean().backward()
    assert all(p.grad is None for p in low.parameters())
    assert w.grad.dtype == torch.float32 and torch.equal(w.grad, 2 * one_pass.float())

    # a step the size of the recipes' lr moves the fp32 masters, and the module gets them rounded to bf16
    opt = torch.optim.SGD(master.parameters(), lr=1.0)
    masters.attach(opt)
    for p in master.parameters():
        p.grad = torch.full_like(p, -1e-6)
    before = w.detach().clone()
    opt.step()
    assert torch.equal(w, before + 1e-6)
    assert torch.equal(low.model.layers[0].mlp.up_proj.weight, w.to(torch.bfloat16))
    with pytest.raises(ValueError, match="the master module's parameters"):
        masters.attach(torch.optim.SGD(low.parameters(), lr=1.0))
