"""What an evaluation plays (train/evaluate.py evaluation_tasks): the held-out games cut to trainer.eval_games,
each trainer.eval_repeats times; repeats of a greedy evaluation are refused (they replay the same episode)."""

from __future__ import annotations

import pytest

from seedfast.config import ConfigError, load_config
from seedfast.runtime.setup import load_tasks
from seedfast.train.evaluate import evaluation_tasks


def test_an_evaluation_plays_each_game_eval_repeats_times(overrides, shared_games, tmp_path):
    games = shared_games("seedfast_eval_tasks_games", [3], 1, 3)
    base = [*overrides(games, tmp_path), "env.n_train=1", "env.n_eval=3", "trainer.eval_games=2"]
    once = evaluation_tasks(load_config(None, base), "eval")
    assert [t.game_id for t in once] == [t.game_id for t in load_tasks(load_config(None, base), "eval")[:2]]
    thrice = evaluation_tasks(load_config(None, [*base, "trainer.eval_repeats=3"]), "eval")
    assert [t.game_id for t in thrice] == [t.game_id for t in once] * 3


def test_repeats_of_a_greedy_evaluation_are_refused():
    with pytest.raises(ConfigError, match="trainer.eval_repeats=2 with rollout.eval_temperature=0"):
        load_config(None, ["trainer.eval_repeats=2", "rollout.eval_temperature=0"])
