"""One evaluation (train/evaluate.py evaluate_policy): `seedfast eval` (app/evaluate.py) and the trainer's in-loop
evaluation (Trainer._evaluate) give one policy the same numbers, for the same config and run.seed. They used to
differ in the seed (the step's seed + 2 in the loop, run.seed in the command), in the games (trainer.eval_games cut
the loop's held-out games only) and in the batching (the loop played every game in one batch of the run's slots, the
command in chunks with their own seeds). The setup lets each show: a sampled evaluation (temperature 1) of a policy
that wins some games, more held-out games than trainer.eval_games, and chunks of env.slots=1 game."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from seedfast.config import load_config
from seedfast.runtime.setup import load_policy, load_run_tokenizer
from seedfast.train.evaluate import evaluate_policy
from seedfast.train.rl import Trainer

SAMPLED = ["rollout.max_response_tokens=16", "rollout.eval_temperature=1.0", "env.n_eval=3", "trainer.eval_games=2",
           "env.slots=1", "run.seed=3"]


@pytest.fixture(scope="module")
def games(train_games, tmp_path_factory) -> Path:
    """The session's games with its two train games held out too (eval entries of their own, first): the acting
    policy learned them, so it wins some, and the numbers move with the seed; the real held-out game comes third,
    past trainer.eval_games."""
    out = tmp_path_factory.mktemp("games") / "games"
    shutil.copytree(train_games, out)
    manifest = json.loads((out / "manifest.json").read_text())
    train = [e for e in manifest["games"] if e["split"] == "train"]
    held_out = [e for e in manifest["games"] if e["split"] == "eval"]
    manifest["games"] = train + [{**e, "id": f"{e['id']}-again", "split": "eval"} for e in train] + held_out
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.fixture(scope="module")
def acting_policy(overrides, games, tmp_path_factory) -> Path:
    """A tiny policy SFT'd long enough on the train games to win them now and then (tests/distributed/
    test_eval_sharded.py's recipe): a barely trained policy never acts, whatever the seed."""
    from seedfast.sft import run as sft

    out = tmp_path_factory.mktemp("acting")
    cfg = load_config(None, [*overrides(games, out), "rollout.max_response_tokens=16", "sft.epochs=100",
                             "sft.lr=1e-2", "sft.prompt_loss=false"])
    sft.main(cfg)
    return cfg.run_dir / "sft"


def _seedfast_eval(args: list[str]) -> dict[str, float]:
    from seedfast.app import evaluate as app

    cfg = load_config(None, args)
    assert app.main(cfg, split="eval") == 0
    return json.loads((Path(cfg.run_dir) / "eval_eval.json").read_text())


def test_seedfast_eval_gives_the_numbers_the_run_logged(overrides, games, acting_policy, tmp_path):
    """A run's last update logs a held-out evaluation of the policy it then exports; `seedfast eval` on the run
    measures that export: the same numbers, key for key."""
    args = [*overrides(games, tmp_path), *SAMPLED, "algorithm=grpo", "trainer.steps=1",
            f"trainer.init_from={acting_policy}"]
    trainer = Trainer(load_config(None, args))
    try:
        history = trainer.run()
    finally:
        trainer.close()
    logged = {k: v for k, v in history[-1].items() if k.startswith("eval/")}
    assert {"eval/success_rate", "eval/invalid_rate", "eval/episode_length", "eval/env_errors"} <= set(logged)
    assert _seedfast_eval(args) == logged


def test_in_loop_evaluation_and_seedfast_eval_agree_on_one_policy_folder(overrides, games, acting_policy, tmp_path):
    args = [*overrides(games, tmp_path), *SAMPLED, f"trainer.init_from={acting_policy}"]
    trainer = Trainer(load_config(None, args))
    try:
        in_loop = trainer._evaluate()
    finally:
        trainer.close()
    assert _seedfast_eval(args) == in_loop


def test_the_numbers_move_with_run_seed(overrides, games, acting_policy, tmp_path):
    """What makes the equalities above mean something: on this policy and these games the seed decides."""
    cfg = load_config(None, [*overrides(games, tmp_path), *SAMPLED])
    model = load_policy(cfg, acting_policy, torch.device("cpu"), trainable=False)
    tokenizer = load_run_tokenizer(cfg, acting_policy)
    runs = set()
    for seed in range(3, 9):
        cfg.run.seed = seed
        runs.add(tuple(sorted(evaluate_policy(cfg, model, tokenizer).items())))
    assert len(runs) > 1


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py
