"""End to end on the tiny model and real games: each algorithm runs a few updates with the loss terms it should have."""

import pytest
import torch
from safetensors.torch import load_file

from seedfast.config import load_config
from seedfast.train.rl import Trainer


def _run(overrides, tiny_policy, train_games, tmp_path, *extra):
    cfg = load_config(None, [*overrides(train_games, tmp_path), *extra])
    trainer = Trainer(cfg, policy_dir=tiny_policy)
    try:
        history = trainer.run()
    finally:
        trainer.close()
    return cfg, trainer, history


def _changed(policy_dir, model) -> bool:
    before = load_file(policy_dir / "model.safetensors")
    after = model.state_dict()
    return any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("algorithm", ["grpo", "seed", "sdar", "grsd"])
def test_each_algorithm_runs_with_its_loss_terms(algorithm, overrides, tiny_policy, train_games, tmp_path):
    # rewards only differ inside a group if some trajectories win: a high temperature and a fixed seed
    cfg, trainer, history = _run(overrides, tiny_policy, train_games, tmp_path, f"algorithm={algorithm}",
                                 "loss.opd_coef=0.5", "loss.kl_coef=0.1")
    assert len(history) == 2
    last = history[-1]
    assert "loss/total" in last and "loss/kl" in last and "eval/success_rate" in last
    # rollout and learner share the weights: their log-probs of the sampled tokens must agree (PITFALLS)
    assert history[0]["rollout/logprob_gap_mean"] < 1e-3
    opd_keys = [k for r in history for k in r if k in ("loss/gate_mean", "loss/opd_term")]
    if algorithm in ("seed", "sdar"):
        assert opd_keys, f"{algorithm} must have an OPD term"
        assert max(r["samples/teacher_valid_rate"] for r in history) > 0
    else:
        assert not opd_keys, f"{algorithm} must not have an OPD term"
    if algorithm == "grsd":
        assert "grsd/reflection_valid_rate" in last
    assert _changed(tiny_policy, trainer.policy), "parameters did not change"
    assert (cfg.run_dir / "hf" / "config.json").is_file()
    assert (cfg.run_dir / "metrics.jsonl").read_text().count("\n") == 2


def test_failing_self_analyzer_masks_opd_and_is_counted(overrides, tiny_policy, train_games, tmp_path):
    """A barely trained policy writes unparsable skills: those trajectories leave OPD, RL goes on."""
    _, _, history = _run(overrides, tiny_policy, train_games, tmp_path, "algorithm=seed", "skill.analyzer=self",
                         "trainer.steps=1")
    row = history[0]
    assert row["skill/parse_rate"] < 1.0
    assert any(k.startswith("skill/fail_") for k in row)
    assert "loss/total" in row
