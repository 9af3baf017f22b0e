"""skill.shuffle=derange, the shuffled-skill control of docs/study.md (seedfast/train/privileged.py): each trajectory
reads the oracle's skills of the same-index trajectory of another game of its update, π a seeded derangement of the
update's games; nothing else about the teacher changes."""

import warnings

import numpy as np
import pytest

from seedfast import seeds
from seedfast.config import ConfigError, load_config
from seedfast.envs.trajectory import Trajectory, TrajectoryStep
from seedfast.rollout.records import StepRecord
from seedfast.train import privileged
from seedfast.train.batch import build_samples
from seedfast.train.privileged import WriterContext, seed_skills

GAMES, PLAYS = 8, 8
WALK = ["go north", "take key", "go south", "unlock chest", "open chest"]


def update(games: int = GAMES, plays: int = PLAYS) -> list[Trajectory]:
    """An update's trajectories as the agent loop returns them: trajectory t*plays + j is play j of game t; every
    game has its own walkthrough (so its oracle skills name it), plays win or lose at different steps."""
    out = []
    for g in range(games):
        walk = [f"{a} {g}" for a in WALK]
        for j in range(plays):
            won = j % 3 == 0
            taken = walk if won else walk[: j % 4] + [f"look {j}"]
            steps = [TrajectoryStep("obs", [], a) for a in taken]
            out.append(Trajectory(task=f"task {g}", game_id=f"game-{g}", steps=steps, won=won, walkthrough=walk,
                                  meta={"group_id": g, "trajectory_index": g * plays + j}))
    return out


def config(shuffle: str = "derange", seed: int = 5):
    return load_config(None, ["algorithm=seed", "skill.analyzer=oracle", "skill.skill_mode=episode_step",
                              f"skill.shuffle={shuffle}", f"run.seed={seed}"])


def skills(trajectories, shuffle="derange", seed=5, step=0):
    return seed_skills(WriterContext(config(shuffle, seed), None, None, step=step), trajectories)


def test_each_game_reads_the_same_index_trajectory_of_its_deranged_game():
    trajectories = update()
    own = skills(trajectories, "none", step=3)
    got = skills(trajectories, step=3)
    perm = privileged.derangement(np.random.default_rng(seeds.skill_shuffle_seed(5, 3)), GAMES)
    assert all(perm[i] != i for i in range(GAMES))  # a derangement: no game keeps its own
    for g in range(GAMES):
        for j in range(PLAYS):
            t, donor = g * PLAYS + j, perm[g] * PLAYS + j
            assert got.episode[t] == own.episode[donor] and got.step[t] == own.step[donor]
            assert got.episode[t] != own.episode[t]  # another game's walkthrough: never its own skill
            assert f" {perm[g]}" in got.episode[t] and f"'go north {g}'" not in got.episode[t]
    # step skills keep their step indices (a loser's skills cover its right steps, a winner's the walkthrough)
    assert any(len(s) == len(WALK) for s in got.step) and any(set(s) == {0} for s in got.step)
    assert got.metrics["skill/shuffled"] == 1.0 and got.metrics["skill/shuffle_games"] == GAMES
    assert got.metrics["skill/shuffle_unshuffled"] == 0.0 and got.metrics["skill/shuffle_mask_moved"] == 0.0
    assert got.metrics["skill/parse_rate"] == own.metrics["skill/parse_rate"] == 1.0


def test_the_permutation_depends_on_the_run_seed_and_the_update_alone():
    first, _ = privileged.shuffle_sources(update(), 5, 2)
    assert privileged.shuffle_sources(update(), 5, 2)[0] == first  # deterministic for a seed
    # other trajectories with the same games: the same π (it never reads what was played)
    other = update()
    for t in other:
        t.won, t.steps = False, []
    assert privileged.shuffle_sources(other, 5, 2)[0] == first
    perms = {tuple(privileged.shuffle_sources(update(), 5, step)[1]) for step in range(16)}
    assert len(perms) >= 15  # different across updates (8! / e ≈ 14833 derangements)
    assert privileged.shuffle_sources(update(), 6, 2)[1] != privileged.shuffle_sources(update(), 5, 2)[1]
    for step in range(16):
        _, perm = privileged.shuffle_sources(update(), 5, step)
        assert sorted(perm) == list(range(GAMES)) and all(p != i for i, p in enumerate(perm))


def test_the_derangement_is_drawn_as_the_protocol_says():
    """numpy.random.default_rng(seeds.skill_shuffle_seed(run.seed, t)).permutation(8), drawn again with the same
    generator until π(i) != i for every i."""
    for step in range(8):
        rng = np.random.default_rng(seeds.skill_shuffle_seed(5, step))
        while True:
            perm = list(rng.permutation(GAMES))
            if all(p != i for i, p in enumerate(perm)):
                break
        assert privileged.shuffle_sources(update(), 5, step)[1] == perm
    with pytest.raises(ValueError, match="at least 2"):
        privileged.derangement(np.random.default_rng(0), 1)


def test_the_teacher_mask_is_the_unshuffled_one():
    """The same step samples are teacher-valid with and without shuffling (the oracle's skills always parse), so
    the term keeps its weight; only what the skill says moves."""
    trajectories = update(4, 4)
    records = [StepRecord((("system", [1]), ("task", [2, 2]), ("history", [3]), ("observation", [4]),
                           ("instructions", [5])), (7, 7), None, 1.0, t // 4, t, s, True, True, "stop")
               for t, traj in enumerate(trajectories) for s in range(len(traj.steps))]
    cfg = config()
    tokenizer = type("T", (), {"encode": staticmethod(lambda text, add_special_tokens=False: [ord(c) % 50 + 10
                                                                                            for c in text])})()
    plain, _ = build_samples(cfg, records, skills(trajectories, "none"), tokenizer)
    shuffled, metrics = build_samples(cfg, records, skills(trajectories), tokenizer)
    assert [s.has_teacher for s in plain] == [s.has_teacher for s in shuffled]
    assert all(s.has_teacher for s in shuffled) and metrics["samples/teacher_valid_rate"] == 1.0
    assert [s.prompt_ids.tolist() for s in plain] == [s.prompt_ids.tolist() for s in shuffled]  # the student's
    assert any(a.insertions[0][1].tolist() != b.insertions[0][1].tolist() for a, b in zip(plain, shuffled))


def test_a_moved_mask_is_counted():
    """A skill that failed to parse moves with its text (the self analyzer): counted, never silent."""
    trajectories = update(2, 2)
    episode, step = ["a0", None, "b0", "b1"], [{}, {}, {}, {}]
    new_episode, _, metrics = privileged.shuffle_skills(trajectories, episode, step, 5, 0)
    assert new_episode == ["b0", "b1", "a0", None]
    assert metrics["skill/shuffle_mask_moved"] == 0.5


def test_one_game_is_left_unshuffled_counted_and_warned():
    trajectories = update(1, 4)
    own = skills(trajectories, "none")
    with pytest.warns(UserWarning, match="one game"):
        got = skills(trajectories)
    assert got.episode == own.episode and got.step == own.step
    assert got.metrics["skill/shuffled"] == 0.0 and got.metrics["skill/shuffle_unshuffled"] == 1.0
    assert got.metrics["skill/shuffle_games"] == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no trajectory at all: nothing to warn about
        assert privileged.shuffle_skills([], [], [], 5, 0)[2]["skill/shuffled"] == 0.0


def test_uneven_games_wrap_the_trajectory_index():
    trajectories = update(2, 3)[:5]  # game 1 lost its last play
    source, perm = privileged.shuffle_sources(trajectories, 5, 0)
    assert perm == [1, 0] and source == [3, 4, 3, 0, 1]  # play 2 of game 0 reads play 2 mod 2 = 0 of game 1


def test_the_option_is_off_by_default_and_checked():
    assert load_config(None, []).skill.shuffle == "none"
    trajectories = update(2, 2)
    assert skills(trajectories, "none").metrics.keys() == {"skill/parse_rate"}
    with pytest.raises(ConfigError):
        load_config(None, ["skill.shuffle=rotate"])


def test_the_trainer_shuffles_each_update_with_its_own_index(overrides, tiny_policy, train_games, tmp_path,
                                                              monkeypatch):
    """The RL loop hands the writer its update's index (WriterContext.step): update t's derangement is drawn with
    (run.seed, t)."""
    from seedfast.train.rl import Trainer

    seen = []
    real = privileged.shuffle_skills

    def spy(trajectories, episode, step, run_seed, update):
        seen.append((run_seed, update, len({t.game_id for t in trajectories})))
        return real(trajectories, episode, step, run_seed, update)

    monkeypatch.setattr(privileged, "shuffle_skills", spy)
    cfg = load_config(None, [*overrides(train_games, tmp_path), "algorithm=seed", "skill.shuffle=derange",
                             "loss.opd_coef=0.5", "run.seed=3"])
    trainer = Trainer(cfg, policy_dir=tiny_policy)
    try:
        history = trainer.run()
    finally:
        trainer.close()
    assert seen == [(3, 0, 2), (3, 1, 2)]
    assert [r["skill/shuffled"] for r in history] == [1.0, 1.0]
    assert [r["skill/shuffle_games"] for r in history] == [2.0, 2.0]
    assert all(r["samples/teacher_valid_rate"] > 0 for r in history)
