"""env.kind=scienceworld builds through the factory the trainer uses (runtime/setup.py make_env_slots), in the worker
pool and inline, with the pool bounded by the JVM's memory; `seedfast envs list|make scienceworld`."""

import pytest

from seedfast.cli import main
from seedfast.config import load_config
from seedfast.envs.scienceworld_env import HEAP_MB, JVM_OVERHEAD_MB, slot_cap
from seedfast.runtime.setup import load_tasks, make_env_slots


def config(*overrides: str):
    return load_config(None, ["env.kind=scienceworld", "env.scienceworld.tasks=[chemistry-mix-paint-secondary-color]",
                              "env.n_train=2", "env.max_steps=30", *overrides])


@pytest.mark.parametrize("isolation", ["process", "inline"])
def test_the_trainers_factory_plays_scienceworld(isolation, tmp_path):
    cfg = config(f"env.isolation={isolation}", f"env.games_dir={tmp_path}")
    task = load_tasks(cfg, "train")[0]
    envs = make_env_slots(cfg, 1)
    try:
        obs = envs.reset({0: task.spec})[0]
        assert not isinstance(obs, str), obs
        assert "green paint" in obs.task and obs.admissible_actions
        go = next(a for a in obs.admissible_actions if a == "go to art studio")
        obs, reward, done, info = envs.step({0: go})[0]
        assert info["valid"] and "art studio" in obs.text and reward == 0.0 and not done
        assert info["score"] > 0
    finally:
        envs.close()


def test_the_pool_is_bounded_by_the_jvms_memory():
    assert slot_cap(HEAP_MB, memory_mb=24 * 1024) == int(0.5 * 24 * 1024 // (HEAP_MB + JVM_OVERHEAD_MB))
    assert slot_cap(HEAP_MB, memory_mb=100) == 1
    cap = slot_cap(HEAP_MB)
    cfg = config("env.isolation=inline")
    with pytest.warns(UserWarning, match=f"memory holds {cap}"):
        envs = make_env_slots(cfg, cap + 5)
    try:
        assert envs.n_slots == cap
    finally:
        envs.close()


def test_envs_list_shows_tasks_and_splits(capsys):
    assert main(["envs", "list", "scienceworld", "env.scienceworld.tasks=[boil,4-3]"]) == 0
    out = capsys.readouterr().out
    assert "30 tasks" in out
    assert [line.split() for line in out.splitlines() if line.startswith("1-1")] == [
        ["1-1", "*boil", "Matter", "14", "7", "9"]]
    assert "4-3  *find-plant" in out
    # env.n_train=16 / env.n_eval=8 per task: boil has 14 train, 7 dev, 9 test; find-plant 150, 75, 75
    assert "30 train, 15 dev (eval), 16 test variations" in out


def test_envs_make_starts_the_simulator(capsys):
    assert main(["envs", "make", "scienceworld", "env.scienceworld.tasks=[find-plant]"]) == 0
    assert "the simulator started and loaded find-plant/0[easy]" in capsys.readouterr().out


def test_the_cpu_recipe_fits_its_gold_sequences(tmp_path):
    from pathlib import Path

    recipe = Path(__file__).resolve().parents[2] / "configs" / "smollm2-135m_scienceworld.yaml"
    cfg = load_config(recipe, [f"env.games_dir={tmp_path}"])
    assert cfg.env.kind == "scienceworld" and cfg.env.scienceworld.simplifications == "easy"
    tasks = load_tasks(cfg, "train")
    assert len(tasks) == cfg.env.n_train * len(cfg.env.scienceworld.tasks)
    # every train variation's gold sequence fits the episode's steps, so SFT's replays and the oracle's skills hold
    # the whole solution
    assert max(len(t.walkthrough) for t in tasks) <= cfg.env.max_steps


def test_the_gpu_recipe_plays_every_task_type():
    from pathlib import Path

    from seedfast.envs.scienceworld_env import task_names

    recipe = Path(__file__).resolve().parents[2] / "configs" / "qwen2.5-7b_scienceworld_8xh100.yaml"
    cfg = load_config(recipe, command="collect")
    assert cfg.env.kind == "scienceworld" and cfg.env.scienceworld.tasks == task_names()
