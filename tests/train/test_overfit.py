"""RL's "overfit one batch": from a weak start, GRPO and SEED on a fixed pool of two games must raise the
success rate on that pool by a clear margin within a handful of updates (10).

Weak start: a short SFT (behaviour cloning on responses, 45 epochs of 6 examples) of a from-scratch tiny
decoder on the two training games of `train_games` (treasure_hunter level 3: `go south|north`, `take
passkey`). It writes `<action>...` but at temperature 1.0 wins ~20% of episodes (the rest: wrong moves, or
junk inside the tag), so groups hold wins and losses. With tasks_per_batch = the pool size, every update
rolls out the same two games. The control is the start policy; it and the trained policy are measured with
the same 128 episodes (64 per game, one sampler seed) at the rollout temperature.

Measured with this file's settings when the schedule stepped once per update (before #53; with the per-step
schedule seed 0 passes both tests, seeds 1-9 not remeasured), start 0.195, RL run.seed 0-9: GRPO -> 0.50-0.66
(+0.31 to +0.47), SEED -> 0.45-0.59 (+0.25 to +0.39); with the advantage sign flipped in Trainer.learn both end
at 0.00-0.01. The margin asserted is 0.15. Other SFT seeds (starts 0.12-0.42, 4 RL seeds each, both algorithms) gained
+0.20 to +0.45. Settings found by measurement (each alternative below failed at some seed):
- env.max_steps=2 (every step of a winning episode is a right action) and rollout.max_response_tokens=5
  (`<action>go south` is 5 tokens; an unclosed tag parses): the samples hold the decision, no trailing junk;
- rollout.n=16, 2 PPO epochs x 2 mini-batches per update at lr 1.5e-3: one on-policy step per update learned
  a few points per update at most, n=8 or lr >= 2e-3 sometimes collapsed to unparsable output (an absorbing
  state: no wins, no signal) within an update or two;
- a warm-up (Adam's first steps are sign steps: one update even at half this lr lost 5-10 points of success):
  measured as 2 warm-up updates when the schedule stepped once per update (update 0's 4 optimizer steps at lr/2);
  counted in optimizer steps since #53, 4 of them at lr/5 .. 4lr/5 take update 0 as far in sum, then lr; a cosine
  decay (at constant lr a late update undid one run in 32) and loss.kl_coef=0.05 (pulls
  a policy drifting into junk back towards the start: 0 of 40 runs over 5 SFT x 4 RL seeds under the margin
  with it, 2 without, one a collapse).
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
import torch

from seedfast.config import Config, load_config
from seedfast.runtime.setup import load_policy, load_run_tokenizer, load_tasks
from seedfast.sft import run as sft
from seedfast.train.evaluate import evaluate
from seedfast.train.rl import Trainer

EPISODES_PER_GAME = 64  # evaluation episodes per pool game, for the control and after training
EVAL_SEED = 4242  # the same sampler seed for control and trained policy
RL_SEED = 0
MARGIN = 0.15

WEAK_START = [
    "model.tiny.hidden=64", "model.tiny.intermediate=128", "model.tiny.bpe_vocab_size=1024",
    "env.max_steps=2", "rollout.max_response_tokens=5", "rollout.temperature=1.0",
    "sft.epochs=45", "sft.batch_tokens=1024", "sft.lr=3e-3", "sft.prompt_loss=false",
    "sft.skill_augment=true", "sft.skill_writing_fraction=0",
]
RL = [
    "rollout.n=16", "rollout.tasks_per_batch=2", "trainer.steps=10", "trainer.ppo_epochs=2",
    "trainer.mini_batches=2", "optim.lr=1.5e-3", "optim.warmup_steps=4", "optim.schedule=cosine",
    "loss.kl_coef=0.05", "trainer.checkpoint_every=0", "trainer.eval_every=0",
]


def pool_success(cfg: Config, model: torch.nn.Module, tokenizer, pool: list) -> float:
    """Success rate over EPISODES_PER_GAME episodes of each pool game at the rollout temperature."""
    metrics = evaluate(cfg, model, tokenizer, pool * EPISODES_PER_GAME, seed=EVAL_SEED,
                       temperature=cfg.rollout.temperature)
    return metrics["eval/success_rate"]


@pytest.fixture(scope="session")
def weak_start(overrides, train_games, tmp_path_factory) -> tuple[Path, list[str], float]:
    """(SFT policy folder, its overrides, control success on the pool): a short SFT that wins sometimes.

    Built once for all xdist workers (it is deterministic), like `train_games`: in the shared base temp
    folder, under a file lock.
    """
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    out = base / "seedfast_overfit_start"
    out.mkdir(exist_ok=True)
    start_overrides = [*overrides(train_games, out), *WEAK_START]
    cfg = load_config(None, start_overrides)
    policy_dir, control_file = cfg.run_dir / "sft", out / "control.json"
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not control_file.is_file():
            sft.main(cfg)
            model = load_policy(cfg, policy_dir, torch.device("cpu"), trainable=False)
            control = pool_success(cfg, model, load_run_tokenizer(cfg, policy_dir), load_tasks(cfg, "train"))
            control_file.write_text(json.dumps({"control": control}))
    return policy_dir, start_overrides, json.loads(control_file.read_text())["control"]


def train_on_pool(weak_start, tmp_path, *extra: str, seed: int = RL_SEED) -> tuple[float, float, list[dict]]:
    """(control, success after RL, history) of an RL run on the fixed pool from the weak start."""
    policy_dir, start_overrides, control = weak_start
    cfg = load_config(None, [*start_overrides, *RL, f"run.out_dir={tmp_path}", f"run.seed={seed}", *extra])
    pool = load_tasks(cfg, "train")
    assert len(pool) == cfg.rollout.tasks_per_batch == 2, "every update must roll out the same games"
    assert 0.05 <= control <= 0.6, f"the start is not weak-but-winning: pool success {control:.3f}"
    trainer = Trainer(cfg, policy_dir=policy_dir)
    try:
        history = trainer.run()
    finally:
        trainer.close()
    assert len(history) == cfg.trainer.steps
    after = pool_success(cfg, trainer.policy, trainer.tokenizer, pool)
    return control, after, history


def _trace(control: float, after: float, history: list[dict]) -> str:
    per_update = ", ".join(f"{r['train/success_rate']:.2f}" for r in history)
    return f"pool success {control:.3f} -> {after:.3f} (per update: {per_update})"


def test_grpo_raises_success_on_a_fixed_pool(weak_start, tmp_path):
    control, after, history = train_on_pool(weak_start, tmp_path, "algorithm=grpo")
    assert after - control >= MARGIN, _trace(control, after, history)


def test_seed_raises_success_on_a_fixed_pool(weak_start, tmp_path):
    control, after, history = train_on_pool(weak_start, tmp_path, "algorithm=seed", "skill.analyzer=oracle",
                                            "loss.opd_coef=0.5")
    assert any(k in row for row in history for k in ("loss/gate_mean", "loss/opd_term")), "no OPD term"
    assert max(row["samples/teacher_valid_rate"] for row in history) > 0, "no sample had a teacher context"
    assert after - control >= MARGIN, _trace(control, after, history)
