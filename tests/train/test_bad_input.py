"""Bad input to the trainer: a missing policy, a non-finite loss (skipped, counted, and fatal after k in a row)."""

import json

import pytest

from seedfast.config import ConfigError, load_config
from seedfast.train import update
from seedfast.train.rl import Trainer


def test_missing_model_path_names_the_key(overrides, train_games, tmp_path):
    cfg = load_config(None, [*overrides(train_games, tmp_path), f"model.path={tmp_path / 'nowhere'}"])
    with pytest.raises(ConfigError, match="model.path"):
        Trainer(cfg)


def test_a_reference_policy_that_is_not_an_hf_folder_names_the_key(overrides, tiny_policy, train_games, tmp_path):
    cfg = load_config(None, [*overrides(train_games, tmp_path), "algorithm=grpo", "loss.kl_coef=0.05",
                             f"model.ref_path={tmp_path / 'no_reference'}"])
    with pytest.raises(ConfigError, match=r"model\.ref_path=.*is not an HF model folder"):
        Trainer(cfg, policy_dir=tiny_policy)


def test_nonfinite_loss_is_skipped_logged_and_stops_after_k(overrides, tiny_policy, train_games, tmp_path,
                                                           monkeypatch):
    real = update.fused_loss

    def poisoned(*args, **kwargs):
        loss, *rest = real(*args, **kwargs)
        return loss * float("nan"), *rest

    monkeypatch.setattr(update, "fused_loss", poisoned)
    cfg = load_config(None, [*overrides(train_games, tmp_path), "algorithm=grpo", "trainer.steps=4",
                             "trainer.max_bad_steps=2", "loss.kl_coef=0"])
    trainer = Trainer(cfg, policy_dir=tiny_policy)
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    try:
        with pytest.raises(FloatingPointError, match="max_bad_steps=2"):
            trainer.run()
    finally:
        trainer.close()
    rows = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0]
    assert rows[0]["train/skipped_nonfinite"] == 1 and rows[0]["optim/updates_applied"] == 0
    after = trainer.policy.state_dict()
    assert all((before[k] == after[k]).all() for k in before), "a non-finite step changed the weights"
