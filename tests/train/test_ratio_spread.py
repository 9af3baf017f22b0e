"""The step size of an RL update: the warm-up counted in optimizer steps (runtime/optim.py lr_at, runtime/setup.py
rl_optimizer, the trainer stepping the schedule after each mini-batch step) and the spread of the probability ratio
exp(ℓθ − ℓold) logged per mini-batch (ratio/mb{k}_*, ratio/moved_*)."""

import math
import shutil

import pytest
import torch

from seedfast.config import load_config
from seedfast.runtime.optim import lr_at
from seedfast.runtime.setup import rl_optimizer
from seedfast.scoring import score


def test_lr_at_warms_the_first_n_optimizer_steps_by_hand():
    # N = 1: lr / 2, then lr (it was lr from the first step: no warm-up)
    assert [lr_at(s, 8, 0.6, warmup=1, schedule="constant") for s in range(3)] == pytest.approx([0.3, 0.6, 0.6])
    # N = 2: lr / 3, 2 lr / 3, then lr
    assert [lr_at(s, 8, 0.6, warmup=2, schedule="constant") for s in range(4)] == pytest.approx([0.2, 0.4, 0.6, 0.6])
    # cosine from step N over the total - N steps left: N = 2 of 10, step 6 is halfway through the 8
    assert [lr_at(s, 10, 0.6, warmup=2) for s in (0, 1, 2, 6)] == pytest.approx([0.2, 0.4, 0.6, 0.3])
    assert lr_at(0, 10, 0.6, warmup=0) == 0.6


def test_the_rl_schedule_counts_every_mini_batch_step():
    cfg = load_config(None, ["optim.lr=0.5", "optim.schedule=cosine", "optim.warmup_steps=3", "trainer.steps=3",
                             "trainer.ppo_epochs=2", "trainer.mini_batches=2"])
    optimizer, scheduler = rl_optimizer(cfg, torch.nn.Linear(2, 2))
    seen = []
    for _ in range(12):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # 3 updates x 2 epochs x 2 mini-batches = 12 optimizer steps
    assert seen == pytest.approx([0.5 * lr_at(s, 12, 1.0, 3, "cosine") for s in range(12)])
    assert seen[:4] == pytest.approx([0.125, 0.25, 0.375, 0.5])


def _run(overrides, games, policy, out, *extra):
    """A Trainer's run of `extra` (grpo, 2 mini-batches), with the indices of each mini-batch it stepped, the
    update's batch and the trained parameters before the update and after each optimizer step."""
    from seedfast.train import rl

    cfg = load_config(None, [*overrides(games, out), "algorithm=grpo", "trainer.mini_batches=2",
                             "trainer.checkpoint_every=0", "loss.kl_coef=0", *extra])
    trainer = rl.Trainer(cfg, policy_dir=policy)
    seen = {"index": [], "batch": [], "params": []}
    snapshot = lambda: {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}  # noqa: E731
    inner_update, inner_loss = trainer._update, rl.minibatch_loss_backward

    def update(batch, **kw):
        seen["batch"].append(batch)
        seen["params"].append([snapshot()])
        return inner_update(batch, **kw)

    def loss(model, batch, index, *args, **kw):
        seen["index"].append(list(index))
        return inner_loss(model, batch, index, *args, **kw)

    trainer._update = update
    trainer.optimizer.register_step_post_hook(lambda *_: seen["params"][-1].append(snapshot()))
    rl.minibatch_loss_backward = loss
    try:
        history = trainer.run()
    finally:
        rl.minibatch_loss_backward = inner_loss
    return trainer, history, seen


@pytest.mark.filterwarnings("ignore::seedfast.config.ConfigWarning")
def test_the_ratio_spread_per_mini_batch_by_hand(overrides, tiny_policy, train_games, tmp_path, one_torch_thread):
    # a large lr and an entropy term (a gradient whatever the rewards): the first step moves θ off θ_old
    trainer, history, seen = _run(overrides, train_games, tiny_policy, tmp_path, "trainer.steps=1", "optim.lr=0.05",
                                  "optim.schedule=constant", "loss.entropy_coef=0.05", "loss.agg=token-mean")
    try:
        row = history[0]
        assert row["optim/updates_applied"] == 2.0 and len(seen["index"]) == 2
        # the first step is on-policy: θ = θ_old, every ratio 1 up to fp32 rounding (ℓold comes from the scoring pass,
        # ℓθ from the update's forward over other batch shapes: measured 1 ± 1e-6), nothing clipped
        assert row["ratio/mb0_min"] == pytest.approx(1.0, abs=1e-5) and row["ratio/mb0_max"] == pytest.approx(
            1.0, abs=1e-5)
        assert row["ratio/mb0_clip_frac"] == 0.0
        # the second mini-batch under θ after the first step, against ℓold under θ_old, scored here
        batch, (before, after_first, _) = seen["batch"][0], seen["params"][0]
        second = [batch.samples[i] for i in seen["index"][1]]
        cfg = trainer.cfg

        def logprob(params):
            trainer.policy.load_state_dict(params)
            with torch.no_grad():
                return score(trainer.policy, second, token_budget=cfg.trainer.micro_batch_tokens,
                             temperature=cfg.rollout.temperature).logprob

        ratio = torch.exp(logprob(after_first).double() - logprob(before).double())
        assert float(ratio.min()) < 0.99 or float(ratio.max()) > 1.01  # it moved
        assert row["ratio/mb1_min"] == pytest.approx(float(ratio.min()), rel=1e-4)
        assert row["ratio/mb1_max"] == pytest.approx(float(ratio.max()), rel=1e-4)
        # two optimizer steps: the moved mini-batch is the second one
        assert (row["ratio/moved_min"], row["ratio/moved_max"]) == (row["ratio/mb1_min"], row["ratio/mb1_max"])
        # clipped: the clipped branch of PPO's max taken (token-mean: each token counts alike)
        per_sample = batch.advantages.numel() == len(batch.samples)
        adv = torch.cat([torch.full((len(batch.samples[i].response_ids),), float(batch.advantages[i]))
                         if per_sample else batch.advantages[batch.token_slice(i)] for i in seen["index"][1]])
        clipped = ((adv > 0) & (ratio > 1 + cfg.loss.clip_high)) | ((adv < 0) & (ratio < 1 - cfg.loss.clip_low))
        assert 0.0 < row["ratio/mb1_clip_frac"] == pytest.approx(float(clipped.double().mean()), abs=1e-6)
    finally:
        trainer.close()


@pytest.mark.filterwarnings("ignore::seedfast.config.ConfigWarning")
def test_the_warm_up_logs_the_lr_of_the_first_and_last_step(overrides, tiny_policy, train_games, tmp_path,
                                                            one_torch_thread):
    lr = 1e-3
    trainer, history, seen = _run(overrides, train_games, tiny_policy, tmp_path, "trainer.steps=2", f"optim.lr={lr}",
                                  "optim.warmup_steps=2", "optim.schedule=constant")
    try:
        assert [r["optim/updates_applied"] for r in history] == [2.0, 2.0]
        assert history[0]["optim/lr"] == pytest.approx(lr / 3) and history[0]["optim/lr_last"] == pytest.approx(
            2 * lr / 3)
        assert history[1]["optim/lr"] == pytest.approx(lr) and history[1]["optim/lr_last"] == pytest.approx(lr)
        assert trainer.scheduler.last_epoch == 4  # 2 updates x 2 mini-batch steps
        assert "ratio/moved_min" in history[0] and math.isfinite(history[0]["ratio/moved_max"])
    finally:
        trainer.close()


@pytest.mark.filterwarnings("ignore::seedfast.config.ConfigWarning")
def test_one_optimizer_step_logs_no_moved_spread(overrides, tiny_policy, train_games, tmp_path, one_torch_thread):
    trainer, history, _ = _run(overrides, train_games, tiny_policy, tmp_path, "trainer.steps=1",
                               "trainer.mini_batches=1")
    try:
        row = history[0]
        assert row["optim/updates_applied"] == 1.0 and row["optim/lr"] == row["optim/lr_last"]
        # no scoring pass (on-policy, one step): ℓold is the detached ℓθ of the update's forward, every ratio exactly 1
        assert row["ratio/mb0_min"] == row["ratio/mb0_max"] == 1.0 and row["ratio/mb0_clip_frac"] == 0.0
        assert not any(k.startswith("ratio/moved_") for k in row)
    finally:
        trainer.close()


@pytest.mark.filterwarnings("ignore::seedfast.config.ConfigWarning", "ignore::seedfast.runtime.resume.ResumeWarning")
def test_a_resume_inside_the_warm_up_repeats_the_uninterrupted_schedule(overrides, tiny_policy, train_games, tmp_path,
                                                                        one_torch_thread):
    """The checkpoint after update 1 holds the schedule 2 optimizer steps in (of a 3-step warm-up): resumed from it,
    updates 1 and 2 take the uninterrupted run's lrs and metrics."""
    from seedfast.train.rl import Trainer

    def run(out, *extra):
        cfg = load_config(None, [*overrides(train_games, out), "algorithm=grpo", "trainer.steps=3",
                                 "trainer.mini_batches=2", "optim.warmup_steps=3", "optim.schedule=cosine",
                                 "trainer.checkpoint_every=1", "trainer.keep_checkpoints=3", *extra])
        trainer = Trainer(cfg, policy_dir=tiny_policy)
        try:
            rows = trainer.run()
            return rows, trainer.scheduler.last_epoch, trainer.paths.ckpt
        finally:
            trainer.close()

    straight, steps, ckpt = run(tmp_path / "straight")
    assert steps == 6
    resumed_dir = tmp_path / "resumed" / "t" / "ckpt"
    resumed_dir.mkdir(parents=True)
    shutil.copytree(ckpt / "step_1", resumed_dir / "step_1")
    resumed, steps, _ = run(tmp_path / "resumed", "trainer.resume=auto")
    assert steps == 6 and [r["step"] for r in resumed] == [1, 2]
    volatile = ("time/", "throughput/", "memory/")
    assert [{k: v for k, v in r.items() if not k.startswith(volatile)} for r in resumed] == [
        {k: v for k, v in r.items() if not k.startswith(volatile)} for r in straight[1:]]
    lr = 1e-3  # tiny_overrides' optim.lr: steps 2 (update 1's first) and 4 (update 2's first) of 6
    assert [r["optim/lr"] for r in straight] == pytest.approx([lr / 4, 3 * lr / 4, lr * 0.5 * (1 + math.cos(
        math.pi / 3))])


@pytest.mark.filterwarnings("ignore::seedfast.config.ConfigWarning")
def test_grsds_reflection_step_runs_at_the_last_lr_and_is_no_step_of_the_schedule(overrides, tiny_policy,
                                                                                  train_games, tmp_path,
                                                                                  one_torch_thread, monkeypatch):
    from seedfast.train import rl
    from seedfast.train.rl import Trainer

    def reflection_step(cfg, policy, optimizer, *args):  # the tiny judge's scores often tie: no step of its own
        optimizer.step()
        return {"grsd/reflection_loss": 1.0}

    monkeypatch.setattr(rl, "reflection_update", reflection_step)
    lr = 1e-3
    cfg = load_config(None, [*overrides(train_games, tmp_path), "algorithm=grsd", "trainer.steps=1",
                             "trainer.mini_batches=2", "optim.warmup_steps=2", "optim.schedule=constant",
                             "trainer.checkpoint_every=0", f"optim.lr={lr}"])
    trainer = Trainer(cfg, policy_dir=tiny_policy)
    stepped = []
    trainer.optimizer.register_step_pre_hook(lambda opt, *_: stepped.append(opt.param_groups[0]["lr"]))
    try:
        row = trainer.run()[0]
        assert row["optim/updates_applied"] == 2.0 and row["grsd/reflection_loss"] == 1.0
        # the two mini-batch steps, then the reflection step at the last one's lr
        assert stepped == pytest.approx([lr / 3, 2 * lr / 3, 2 * lr / 3])
        assert trainer.scheduler.last_epoch == 2 and trainer.optimizer.param_groups[0]["lr"] == pytest.approx(lr)
    finally:
        trainer.close()
