"""End to end on the tiny model and real games: each algorithm runs a few updates with the loss terms it should have."""

import json

import pytest
import torch
from safetensors.torch import load_file

from seedfast.config import load_config
from seedfast.envs.trajectory import Trajectory
from seedfast.rollout.agent_loop import Task
from seedfast.runtime.paths import RunPaths
from seedfast.runtime.profiling import PhaseTimer
from seedfast.train.draws import choose_tasks, task_pool
from seedfast.train.privileged import Privileged
from seedfast.train.rl import Trainer, groups_with_signal, record_skills


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
    # rollout and learner share the weights: their log-probs of the sampled tokens must agree (docs/pitfalls.md,
    # 'Weight sync that silently does nothing')
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
    logged = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(logged) == 2
    # the rows TensorBoard gets too: only names a person reads, never the update's internal (`_`) bookkeeping
    assert [k for row in logged for k in row if any(part.startswith("_") for part in k.split("/"))] == []
    skills = RunPaths.of(cfg).skills
    if algorithm == "grpo":
        assert not skills.exists()
    else:  # what the teacher read, for a person: a few trajectories of every update
        rows = [json.loads(line) for line in skills.read_text().splitlines()]
        assert {r["step"] for r in rows} == {0, 1} and all(set(r) >= {"episode", "steps", "won"} for r in rows)


def test_failing_self_analyzer_masks_opd_and_is_counted(overrides, tiny_policy, train_games, tmp_path):
    """A barely trained policy writes unparsable skills: those trajectories leave OPD, RL goes on."""
    _, _, history = _run(overrides, tiny_policy, train_games, tmp_path, "algorithm=seed", "skill.analyzer=self",
                         "trainer.steps=1")
    row = history[0]
    assert row["skill/parse_rate"] < 1.0
    assert any(k.startswith("skill/fail_") for k in row)
    assert "loss/total" in row


def test_control_run_rolls_out_what_a_real_run_rolls_out_before_it_learns(overrides, tiny_policy, train_games,
                                                                          tmp_path):
    cfg = load_config(None, [*overrides(train_games, tmp_path), "algorithm=grpo", "rollout.temperature=1.5",
                             "trainer.steps=2", "loss.kl_coef=0"])
    control = Trainer(cfg, policy_dir=tiny_policy, run_dir=tmp_path / "control")
    try:
        rows = control.control_run()
        first = control.rollout(0, PhaseTimer())
    finally:
        control.close()
    assert [r["step"] for r in rows] == [0, 1] and not _changed(tiny_policy, control.policy)
    _, _, history = _run(overrides, tiny_policy, train_games, tmp_path, "algorithm=grpo", "rollout.temperature=1.5",
                         "loss.kl_coef=0")
    # update 0 of a real run rolls out the start policy on the same games with the same seeds
    assert rows[0]["train/success_rate"] == history[0]["train/success_rate"]
    assert rows[0]["train/groups_with_signal"] == history[0]["train/groups_with_signal"]
    assert len(first.trajectories) == cfg.rollout.n * cfg.rollout.tasks_per_batch


def test_task_pool_fixes_the_games_every_update_draws():
    tasks = [Task(f"g{i}", f"/games/g{i}") for i in range(10)]
    pool = task_pool(tasks, 3, seed=5)
    assert len(pool) == 3 and pool == task_pool(tasks, 3, seed=5) and pool != task_pool(tasks, 3, seed=6)
    assert task_pool(tasks, None, seed=5) == tasks and task_pool(tasks, 20, seed=5) == tasks
    draws = {tuple(t.game_id for t in choose_tasks(pool, 3, seed=0, step=s)) for s in range(5)}
    assert draws == {tuple(t.game_id for t in pool)}


def test_groups_with_signal_counts_groups_with_a_win_and_a_loss():
    def traj(group, won):
        t = Trajectory(task="", game_id="g", won=won)
        t.meta["group_id"] = group
        return t

    trajectories = [traj(0, True), traj(0, False), traj(1, False), traj(1, False), traj(2, True), traj(2, True)]
    assert groups_with_signal(trajectories) == pytest.approx(1 / 3)


def test_recorded_skills_include_a_winner_when_one_won(tmp_path):
    trajectories = [Trajectory(task=f"t{i}", game_id=f"g{i}", won=i == 6) for i in range(8)]
    privileged = Privileged(episode=[f"skill {i}" for i in range(8)], step=[{0: f"step {i}"} for i in range(8)])
    record_skills(tmp_path / "s.jsonl", 3, trajectories, privileged)
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [r["game_id"] for r in rows] == ["g0", "g1", "g2", "g6"]
    assert rows[-1] == {"step": 3, "game_id": "g6", "won": True, "actions": [], "episode": "skill 6",
                        "steps": {"0": "step 6"}}
