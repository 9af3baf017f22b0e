"""ScienceWorld's splits cannot leak: the committed table is the jar's, the three splits are disjoint, and the code
paths that pick what a run trains on (RL's pool, collection, SFT) see train variations only, the run's evaluation dev
ones, and only `seedfast eval --split test` the test ones."""

import pytest

from seedfast.app.collect import collect_tasks
from seedfast.config import SCIENCEWORLD_TASKS, ConfigError, load_config
from seedfast.envs.scienceworld_env import SPLITS, Simulator, split_table, task_table
from seedfast.runtime.setup import load_tasks
from seedfast.sft.run import walkthrough_replays
from seedfast.train.draws import task_pool
from seedfast.train.evaluate import evaluation_tasks

# tasks with few train variations, so that every one of them (env.n_train=null) gets its gold sequence quickly
TASKS = ["power-component", "identify-life-stages-2", "identify-life-stages-1"]


@pytest.fixture(scope="module")
def games_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("scienceworld_games")  # the gold cache, shared by this module's tests


def config(games_dir, *overrides: str, tasks=TASKS):
    return load_config(None, ["env.kind=scienceworld", f"env.scienceworld.tasks=[{', '.join(tasks)}]",
                              f"env.games_dir={games_dir}", "env.n_train=null", "env.n_eval=null", *overrides])


def split_of(spec) -> str:
    return next(s for s in SPLITS if spec.variation in split_table()[spec.task][s])


def test_the_committed_table_is_the_jars():
    assert [(t["task_id"], t["task_name"]) for t in task_table()] == list(SCIENCEWORLD_TASKS)
    sim = Simulator()
    try:
        assert sorted(sim.call(lambda s: list(s.getTaskNames()), 30)) == sorted(split_table())
        for name in split_table():
            sim.call(lambda s, n=name: s.load(n, 0, "", False), 60)
            jar = {"train": sim.call(lambda s: list(s.getVariationsTrain()), 30),
                   "dev": sim.call(lambda s: list(s.getVariationsDev()), 30),
                   "test": sim.call(lambda s: list(s.getVariationsTest()), 30)}
            assert jar == split_table()[name], name
            assert len(jar["test"]) > 0 and len(jar["dev"]) > 0
            assert sim.call(lambda s, n=name: s.getTaskMaxVariations(n), 30) == sum(map(len, jar.values()))
    finally:
        sim.kill()


def test_the_splits_are_disjoint_and_cover_every_variation():
    for name, splits in split_table().items():
        seen = [v for s in SPLITS for v in splits[s]]
        assert sorted(seen) == list(range(len(seen))), name


@pytest.mark.parametrize("overrides", [(), ("env.n_train=3", "env.n_eval=2", "rollout.task_pool=5", "run.seed=7")])
def test_no_test_variation_reaches_rl_or_collection(games_dir, overrides):
    cfg = config(games_dir, *overrides)
    rl_pool = task_pool(load_tasks(cfg, "train", skipped=[]), cfg.rollout.task_pool, cfg.run.seed)  # train/rl.py
    collected = collect_tasks(cfg)  # `seedfast collect`
    assert rl_pool and collected
    assert {split_of(t.spec) for t in rl_pool} == {split_of(t.spec) for t in collected} == {"train"}
    assert {t.spec.task for t in load_tasks(cfg, "train")} == set(TASKS)
    assert all(t.walkthrough for t in rl_pool)  # train tasks carry their gold sequences
    # the run's evaluation (selection) plays dev variations, the held-out test ones only on request; neither
    # carries a gold sequence
    for split, theirs in (("eval", "dev"), ("test", "test"), ("train", "train")):
        tasks = evaluation_tasks(cfg, split)
        assert tasks and {split_of(t.spec) for t in tasks} == {theirs}
        assert split == "train" or not any(t.walkthrough for t in tasks)


def test_no_test_variation_reaches_sft(games_dir):
    cfg = config(games_dir, "env.n_train=1", tasks=["lifespan-longest-lived", "find-non-living-thing"])
    replays = walkthrough_replays(cfg)  # `seedfast sft`'s behaviour cloning and skill-writing data
    assert [r.game_id for r in replays] == [f"{t}/{split_table()[t]['train'][0]}[easy]"
                                            for t in ("lifespan-longest-lived", "find-non-living-thing")]
    assert all(r.success.won for r in replays)


def test_limits_count_variations_per_task_and_keep_every_task(games_dir):
    cfg = config(games_dir, "env.n_train=2", "env.n_eval=1", "trainer.eval_games=3")
    train = load_tasks(cfg, "train")
    assert [t.spec.task for t in train] == [*TASKS, *TASKS]
    assert [t.spec.variation for t in train[:3]] == [split_table()[n]["train"][0] for n in TASKS]
    assert len(evaluation_tasks(cfg, "test")) == 3


def test_bad_scienceworld_config_names_the_key():
    with pytest.raises(ConfigError, match=r"env.scienceworld.tasks: unknown ScienceWorld task 'boiling'.*boil \(1-1\)"):
        load_config(None, ["env.kind=scienceworld", "env.scienceworld.tasks=boiling"])
    with pytest.raises(ConfigError, match="env.scienceworld.simplifications: unknown simplification 'fast'"):
        load_config(None, ["env.kind=scienceworld", "env.scienceworld.simplifications=fast"])
    with pytest.raises(ConfigError, match="env.scienceworld.call_timeout_s=40 must be below env.step_timeout_s=30"):
        load_config(None, ["env.kind=scienceworld", "env.scienceworld.call_timeout_s=40"])
    assert load_config(None, ["env.kind=scienceworld", "env.scienceworld.tasks=1-1"]).env.scienceworld.tasks == ["boil"]
    with pytest.raises(ConfigError, match="'test' is ScienceWorld's"):
        load_tasks(load_config(None, ["env.kind=textworld"]), "test")
