"""`seedfast eval --per-game` (app/evaluate.py): the evaluation's own plays, one record each, beside metrics that the
record does not change. A sampled evaluation (temperature 1) in chunks of one game with two plays per game, so the
record has to follow the evaluation's chunks, seeds and repeats to agree with its metrics."""

import json
from pathlib import Path

import pytest

from seedfast import cli
from seedfast.config import ConfigError, load_config
from seedfast.train.evaluate import evaluation_tasks

SAMPLED = ["rollout.eval_temperature=1.0", "env.n_eval=2", "env.slots=1", "trainer.eval_repeats=2", "run.seed=3"]


def _evaluate(args: list[str], per_game: bool) -> dict:
    from seedfast.app import evaluate as app

    cfg = load_config(None, args)
    assert app.main(cfg, split="eval", per_game=per_game) == 0
    return json.loads((Path(cfg.run_dir) / "eval_eval.json").read_text())


@pytest.fixture
def args(overrides, shared_games, tiny_policy, tmp_path) -> list[str]:
    games = shared_games("seedfast_per_game_games", [3], 2, 2)
    return [*overrides(games, tmp_path), *SAMPLED, f"trainer.init_from={tiny_policy}"]


def test_the_record_is_the_evaluation_and_changes_none_of_its_metrics(args):
    plain = _evaluate(args, per_game=False)
    recorded = _evaluate(args, per_game=True)
    plays = recorded.pop("per_game")
    assert recorded == plain  # the same numbers, key for key: the record only watched
    tasks = evaluation_tasks(load_config(None, args), "eval")  # the games, repeated eval_repeats times
    assert [p["game_id"] for p in plays] == [t.game_id for t in tasks] and len(plays) == 4
    assert sum(p["won"] for p in plays) / len(plays) == plain["eval/success_rate"]
    assert sum(p["steps"] for p in plays) / len(plays) == plain["eval/episode_length"]
    assert all(len(p["actions"]) == p["steps"] and 0 <= p["invalid"] <= p["steps"] for p in plays)


def test_the_agent_loop_is_given_back(args):
    from seedfast.app.evaluate import plays_recorded
    from seedfast.train import evaluate as evaluation

    original = evaluation.run_agent_loop
    with pytest.raises(RuntimeError), plays_recorded([]):
        assert evaluation.run_agent_loop is not original
        raise RuntimeError("an evaluation that fails")
    assert evaluation.run_agent_loop is original


def test_the_flag_reaches_the_command_and_is_refused_under_torchrun(args, monkeypatch):
    seen = {}
    monkeypatch.setattr("seedfast.app.evaluate.main", lambda cfg, **flags: seen.update(flags) or 0)
    assert cli.main(["eval", *args, "--per-game"]) == 0 and seen == {"split": "eval", "per_game": True}
    seen.clear()
    assert cli.main(["eval", *args]) == 0 and seen == {"split": "eval"}
    monkeypatch.undo()
    from seedfast.app import evaluate as app

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="--per-game runs in one process"):
        app.main(load_config(None, args), per_game=True)


def test_a_scored_play_keeps_its_final_score_and_a_failed_one_its_error():
    from seedfast.app.evaluate import play_record
    from seedfast.envs.trajectory import Trajectory, TrajectoryStep

    steps = [TrajectoryStep("room", [], "look around"), TrajectoryStep("room", [], "focus on the cup", valid=False)]
    plain = Trajectory("task", "g0", steps=steps)
    assert play_record(plain) == {"game_id": "g0", "won": False, "steps": 2, "invalid": 1,
                                  "actions": ["look around", "focus on the cup"]}  # TextWorld's, as it was
    scored = Trajectory("task", "g1", steps=steps, meta={"scores": [25, -100]})
    assert play_record(scored)["score"] == -100 and "error" not in play_record(scored)
    failed = Trajectory("task", "g2", steps=steps[:1], error="timeout: step", meta={"scores": [None]})
    assert play_record(failed)["score"] is None and play_record(failed)["error"] == "timeout: step"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py
