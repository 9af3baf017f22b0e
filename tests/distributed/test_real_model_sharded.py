"""The real pretrained model under FSDP2 mixed precision (issue #21, point 4): SmolLM2-135M-Instruct with the
real-model recipe's loss and optimizer, bf16 compute over fp32 master weights, gradients reduced in fp32. Two
updates on 2 gloo ranks against one process that computes in bf16 over fp32 master copies (runtime/precision.py),
and the ranks' DCP checkpoint after the first update resumes to the same second update.

bf16 tolerance, said once: the two runs round differently (each rank's bf16 gradients over its own micro-batches,
reduced in fp32, against one process's), so they agree on the loss to 1% and on the update's direction (cosine
> 0.95 over all master weights), and no weight is further apart than the two Adam steps can move it (2 x 2 x lr).
The resume is exact."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from seedfast.config import load_config
from seedfast.context.sample import StepSample
from seedfast.distributed.data import DataParallel, split_whole_groups
from seedfast.model.tokenizer import load_tokenizer
from seedfast.runtime.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from seedfast.runtime.optim import grad_norm_and_clip
from seedfast.runtime.setup import load_trainable_policy, rl_optimizer, shard_policy, watch_precision
from seedfast.train.update import UpdateBatch, minibatch_loss_backward
from tests.distributed.dist_helpers import run_on_ranks

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "smollm2-135m_textworld_cpu.yaml"
MODEL = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
pytestmark = pytest.mark.skipif(not (MODEL / "config.json").is_file(),
                                reason="the real model is not fetched: run `seedfast models fetch smollm2-135m`")

ROOMS = ["kitchen", "attic", "cellar", "garden", "study", "pantry"]
ACTIONS = ["go north", "take passkey", "open door", "go east"]


def _config(strategy: str):
    return load_config(str(RECIPE), [f"model.path={MODEL}", "model.dtype=bf16", "optim.master_dtype=fp32",
                                     f"dist.strategy={strategy}", "trainer.device=cpu", "rollout.tasks_per_batch=2",
                                     "optim.warmup_steps=0"])


def _samples(step: int) -> tuple[list[StepSample], torch.Tensor]:
    """Step samples in the recipe's chat format: 2 groups of 3, rewards that differ within each group."""
    tok = load_tokenizer(MODEL)
    out = []
    for i in range(6):
        room = ROOMS[(i + step) % len(ROOMS)]
        text = tok.apply_chat_template(
            [{"role": "user", "content": f"You are in the {room}. Your task: find the passkey. What do you do?"}],
            add_generation_prompt=True, tokenize=False)
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        response = tok(f"<action>{ACTIONS[(i * 3 + step) % len(ACTIONS)]}</action>", add_special_tokens=False)
        out.append(StepSample(prompt_ids=torch.tensor(prompt), response_ids=torch.tensor(response["input_ids"]),
                              sample_id=("s", step, i), group_id=i // 3, reward=float(i % 3 == step % 3)))
    return out, torch.tensor([s.reward for s in out]) - 1 / 3


def _update(cfg, policy, optimizer, scheduler, step: int, dp: DataParallel | None) -> float:
    samples, adv = _samples(step)
    if dp is not None:
        keep = split_whole_groups(list(range(len(samples))), [s.group_id for s in samples],
                                  [len(s.prompt_ids) + len(s.response_ids) for s in samples], dp.rank, dp.size)
        samples, adv = [samples[i] for i in keep], adv[keep]
    optimizer.zero_grad(set_to_none=True)
    loss, _ = minibatch_loss_backward(policy, UpdateBatch(samples, adv, None), list(range(len(samples))), cfg.loss,
                                      use_kl=False, use_opd=False, temperature=cfg.rollout.temperature,
                                      token_budget=cfg.trainer.micro_batch_tokens, dp=dp)
    grad_norm_and_clip(optimizer, cfg.optim.grad_clip)
    optimizer.step()
    scheduler.step()
    return loss


def _build(cfg):
    policy, trained, masters = load_trainable_policy(cfg, MODEL, torch.device("cpu"))
    dp = shard_policy(cfg, policy, torch.device("cpu"))
    optimizer, scheduler = rl_optimizer(cfg, trained)
    watch_precision(cfg, optimizer, masters)
    return policy, trained, optimizer, scheduler, dp


def _masters(trained) -> dict[str, torch.Tensor]:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in trained.named_parameters()}


def _two_ranks(rank: int, world: int, folder: str) -> None:
    cfg = _config("fsdp")
    policy, trained, optimizer, scheduler, dp = _build(cfg)
    assert next(trained.parameters()).dtype == torch.float32
    losses = [_update(cfg, policy, optimizer, scheduler, 0, dp)]
    save_checkpoint(f"{folder}/ckpt", 1, trained, optimizer, scheduler, {})
    losses.append(_update(cfg, policy, optimizer, scheduler, 1, dp))
    weights = _masters(trained)
    del policy, trained, optimizer, scheduler

    policy, trained, optimizer, scheduler, dp = _build(cfg)
    assert load_checkpoint(latest_checkpoint(f"{folder}/ckpt"), trained, optimizer, scheduler)["step"] == 1
    resumed_loss = _update(cfg, policy, optimizer, scheduler, 1, dp)
    resumed = _masters(trained)
    if rank == 0:
        torch.save({"losses": losses, "weights": weights, "resumed_loss": resumed_loss, "resumed": resumed},
                   f"{folder}/two_ranks.pt")


def _adam_step_bound(betas: list[float], steps: int) -> float:
    """The largest |m̂/√v̂| of AdamW's first `steps` steps over any gradients: m̂ and v̂ weigh the gradients g_i with
    a_i and c_i, and max Σ a_i g_i / √(Σ c_i g_i²) = √(Σ a_i² / c_i) (Cauchy-Schwarz); 1 at step 1, 1.0014 at step 2
    for betas (0.9, 0.999)."""
    b1, b2 = betas
    best = 0.0
    for t in range(1, steps + 1):
        a = [(1 - b1) * b1 ** (t - i) / (1 - b1 ** t) for i in range(1, t + 1)]
        c = [(1 - b2) * b2 ** (t - i) / (1 - b2 ** t) for i in range(1, t + 1)]
        best = max(best, sum(x * x / y for x, y in zip(a, c)) ** 0.5)
    return best


def test_the_adam_step_bound_by_hand():
    assert _adam_step_bound([0.9, 0.999], steps=1) == pytest.approx(1.0)
    # step 2: a = (0.09, 0.1)/0.19, c = (0.000999, 0.001)/0.001999
    a, c = [0.09 / 0.19, 0.1 / 0.19], [0.000999 / 0.001999, 0.001 / 0.001999]
    assert _adam_step_bound([0.9, 0.999], steps=2) == pytest.approx((a[0] ** 2 / c[0] + a[1] ** 2 / c[1]) ** 0.5)
    assert 1.001 < _adam_step_bound([0.9, 0.999], steps=2) < 1.002


def test_two_rank_mixed_precision_updates_match_one_process_and_resume(tmp_path):
    cfg = _config("none")
    start = _masters(load_trainable_policy(cfg, MODEL, torch.device("cpu"))[1])
    policy, trained, optimizer, scheduler, _ = _build(cfg)
    assert policy is not trained and next(policy.parameters()).dtype == torch.bfloat16  # master copies
    losses = [_update(cfg, policy, optimizer, scheduler, step, None) for step in range(2)]
    one = _masters(trained)
    del policy, trained, optimizer

    run_on_ranks(2, _two_ranks, str(tmp_path))
    two = torch.load(tmp_path / "two_ranks.pt")

    print(f"losses one process {losses}, two ranks {two['losses']}")  # the numbers behind the note (pytest -s)
    assert two["losses"] == pytest.approx(losses, rel=1e-2)
    # each weight, in either run: two AdamW steps of at most lr·r (r = _adam_step_bound), the decoupled decay
    # lr·wd·|w|, and the fp32 rounding of each new master (at most half its spacing, eps·|w|/2: beside a step of
    # lr = 1e-6 it is not negligible for weights of a few units, as norm weights are)
    lr, wd, eps = cfg.optim.lr, cfg.optim.weight_decay, torch.finfo(torch.float32).eps
    size = torch.cat([start[n].abs().flatten() for n in start]) + 4 * lr
    reach = 2 * 2 * (lr * _adam_step_bound(cfg.optim.betas, steps=2) + lr * wd * size + eps * size / 2)
    moved_one = torch.cat([(one[n] - start[n]).flatten() for n in start])
    moved_two = torch.cat([(two["weights"][n] - start[n]).flatten() for n in start])
    cosine = float(torch.nn.functional.cosine_similarity(moved_one, moved_two, dim=0))
    apart = (moved_one - moved_two).abs()
    print(f"update cosine {cosine:.4f}, farthest weight {float(apart.max()):.3g} (its reach "
          f"{float(reach[apart.argmax()]):.3g})")
    assert cosine > 0.95
    assert bool((apart <= reach).all())
    assert float(moved_one.abs().max()) > cfg.optim.lr / 2  # the updates moved the fp32 masters
    assert two["resumed_loss"] == two["losses"][1]
    for n, w in two["weights"].items():
        assert torch.equal(two["resumed"][n], w), n
