"""Evaluation split over 2 CPU processes (gloo) equals one process exactly: train/evaluate.py's chunks (each with
its own seed) give the same success rate, episode length, invalid rate and environment errors on 1 and 2 ranks,
and `seedfast eval` under 2 ranks writes the eval_<split>.json one process writes, rank 0 alone writing it, and
ends its process group when done (docs/scaling.md)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from seedfast.config import load_config
from seedfast.distributed.data import DataParallel
from seedfast.runtime.setup import load_policy, load_run_tokenizer, load_tasks
from seedfast.train.evaluate import evaluate
from tests.distributed.dist_helpers import run_on_ranks

GAMES_REPEAT, CHUNK, TEMPERATURE = 5, 3, 1.0  # 10 games in 4 chunks (3, 3, 3, 1); sampled, so seeds matter
ACTING = ["rollout.max_response_tokens=16"]  # room for a whole <action>...</action>


@pytest.fixture(scope="module")
def acting_policy(overrides, train_games, tmp_path_factory) -> Path:
    """A tiny policy SFT'd long enough on the 2 games to act (sometimes): outcomes then vary with the seed, so an
    evaluation that got the chunk seeds wrong would show (an untrained policy never wins nor plays a valid
    action, whatever the seed)."""
    from seedfast.sft import run as sft

    out = tmp_path_factory.mktemp("acting")
    cfg = load_config(None, [*overrides(train_games, out), *ACTING, "sft.epochs=100", "sft.lr=1e-2",
                             "sft.prompt_loss=false"])
    sft.main(cfg)
    return cfg.run_dir / "sft"


def _metrics(overrides: list[str], policy: str, dp, seed: int = 11) -> dict[str, float]:
    cfg = load_config(None, overrides)
    model = load_policy(cfg, Path(policy), torch.device("cpu"), trainable=False)
    tasks = load_tasks(cfg, "train") * GAMES_REPEAT
    return evaluate(cfg, model, load_run_tokenizer(cfg, Path(policy)), tasks, seed=seed, temperature=TEMPERATURE,
                    dp=dp, chunk_games=CHUNK)


def _split_worker(rank: int, world: int, overrides: list[str], policy: str, expected: dict[str, float]) -> None:
    got = _metrics(overrides, policy, DataParallel(rank, world))
    assert got == expected  # exactly: the same integer counts, divided the same way


def test_two_rank_evaluation_equals_one_process(overrides, acting_policy, train_games, tmp_path):
    args = [*overrides(train_games, tmp_path), *ACTING]
    one = _metrics(args, str(acting_policy), DataParallel(0, 1))
    assert set(one) == {"eval/success_rate", "eval/episode_length", "eval/invalid_rate", "eval/env_errors"}
    assert 0 < one["eval/success_rate"] < 1 and 0 < one["eval/invalid_rate"] < 1  # outcomes vary
    other = _metrics(args, str(acting_policy), DataParallel(0, 1), seed=12)
    assert other != one  # the seeds decide: equality below is not one fixed outcome
    run_on_ranks(2, _split_worker, args, str(acting_policy), one)


def test_one_chunk_is_the_unsplit_evaluation(overrides, acting_policy, train_games, tmp_path):
    """Chunk 0 plays with the caller's seed: a chunk holding every game is the one-batch evaluation."""
    cfg = load_config(None, [*overrides(train_games, tmp_path), *ACTING])
    model = load_policy(cfg, Path(acting_policy), torch.device("cpu"), trainable=False)
    tokenizer = load_run_tokenizer(cfg, Path(acting_policy))
    tasks = load_tasks(cfg, "train") * GAMES_REPEAT
    whole = evaluate(cfg, model, tokenizer, tasks, seed=11, temperature=TEMPERATURE)
    assert whole == evaluate(cfg, model, tokenizer, tasks, seed=11, temperature=TEMPERATURE,
                             dp=DataParallel(0, 1), chunk_games=len(tasks))


def _app_worker(rank: int, world: int, overrides: list[str], report: str) -> None:
    from seedfast import cli

    replaced = []
    real = os.replace

    def spy(src, dst):
        replaced.append(str(dst))
        real(src, dst)

    os.replace = spy
    try:
        assert cli.main(["eval", *overrides, "--split", "train"]) == 0
    finally:
        os.replace = real
    assert not dist.is_initialized()  # the command ended the process group it ran in
    # reported through a file: a second process group on the same port can race the first one's teardown
    Path(report, f"rank{rank}.json").write_text(json.dumps(replaced))


def test_seedfast_eval_on_two_ranks_writes_what_one_process_writes(overrides, acting_policy, train_games,
                                                                   tmp_path):
    from seedfast.app import evaluate as app

    # env.slots=1: chunks of one game, one for each rank
    args = [*overrides(train_games, tmp_path), *ACTING, f"rollout.eval_temperature={TEMPERATURE}", "env.slots=1"]
    run = load_config(None, args).run_dir
    run.mkdir(parents=True)
    shutil.copytree(acting_policy, run / "sft")
    assert app.main(load_config(None, args), split="train") == 0  # one process, no process group
    one = json.loads((run / "eval_train.json").read_text())
    (run / "eval_train.json").unlink()
    report = tmp_path / "replaced"
    report.mkdir()
    run_on_ranks(2, _app_worker, [*args, "dist.strategy=fsdp"], str(report))
    assert json.loads((run / "eval_train.json").read_text()) == one
    assert sorted(p.name for p in run.iterdir()) == ["eval_train.json", "sft"]  # no temporary file left
    assert json.loads((report / "rank0.json").read_text()) == [str(run / "eval_train.json")]
    assert json.loads((report / "rank1.json").read_text()) == []  # the other rank writes nothing


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py
