"""`seedfast eval RUN [--split train|eval]`: the run's exported policy (hf/, else its SFT output sft/) on the
train or held-out games, one trajectory per game at rollout.eval_temperature; writes eval_<split>.json. It runs
train/evaluate.py's evaluate_policy, the very evaluation the trainer runs in the loop: the same games (the held-out
ones cut to trainer.eval_games), seed (seeds.eval_seed(run.seed)) and chunks, so a policy gets the numbers here
that its run logged for it.

One code path for 1 and N processes: under torchrun with dist.strategy=fsdp the games are split over the ranks
(train/evaluate.py: fixed chunks, each with its own seed, counts added over the ranks), so N processes write the
metrics one process writes. The policy is loaded WHOLE on every rank, no FSDP: evaluation only generates, and a
7B policy in bf16 fits one GPU; every rank is then a data-parallel rank (dist.dp_shard and dist.tp do not shard
it). Rank 0 alone prints and writes the JSON, atomically (docs/scaling.md).

`--per-game` adds the evaluation's own trajectories to the JSON, one record per play in the order played
(`per_game`: game id, won, steps, invalid actions, actions; a scored world's final score): a paired comparison of
two policies game by game (docs/study_smollm2.md) needs to know which game each won. The record is taken from the
very agent-loop calls the evaluation makes, so its wins are the metrics' wins; one process only (the other ranks'
chunks are not gathered).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from seedfast.app.report import write_json
from seedfast.config import Config, ConfigError
from seedfast.distributed.data import DataParallel
from seedfast.distributed.mesh import DistEnv
from seedfast.runtime.paths import RunPaths
from seedfast.runtime.setup import device_of, load_policy, load_run_tokenizer, start_processes, trained_policy_path
from seedfast.train.evaluate import evaluate_policy


def play_record(trajectory: Any) -> dict[str, Any]:
    """One play: its game, outcome, steps, invalid actions and actions; in a scored world (ScienceWorld) also the
    final score (`score`, the last step's, None before any), and `error` where the environment failed the episode
    (a failed step is counted, never hidden). A play with neither (TextWorld's, unless it failed) is recorded as
    before."""
    out = {"game_id": trajectory.game_id, "won": bool(trajectory.won), "steps": len(trajectory.steps),
           "invalid": trajectory.n_invalid, "actions": list(trajectory.actions)}
    scores = trajectory.meta.get("scores")
    if scores is not None:
        out["score"] = scores[-1] if scores else None
    if trajectory.error is not None:
        out["error"] = trajectory.error
    return out


@contextlib.contextmanager
def plays_recorded(into: list[dict[str, Any]]) -> Iterator[None]:
    """Every trajectory train/evaluate.py's evaluation plays while the block runs, appended to `into` as a
    play_record in the order played. Its agent loop is wrapped, not replaced: chunks, seeds and slots stay the
    evaluation's (train/ is not changed for a command's option)."""
    from seedfast.train import evaluate as evaluation

    original = evaluation.run_agent_loop

    def recording(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        into.extend(play_record(t) for t in result.trajectories)
        return result

    evaluation.run_agent_loop = recording
    try:
        yield
    finally:
        evaluation.run_agent_loop = original


def main(cfg: Config, split: str = "eval", per_game: bool = False, **_: Any) -> int:
    if per_game and DistEnv.from_environ().world > 1:
        raise ConfigError("--per-game runs in one process: the other ranks' plays are not gathered")
    env = start_processes(cfg, "eval")  # one process, or this rank of torchrun's (docs/scaling.md)
    paths = RunPaths.of(cfg)
    path = trained_policy_path(cfg)  # hf/, else init_from / sft/ / model.path: a base model is measured too
    device = device_of(cfg)
    model = load_policy(cfg, path, device, trainable=False)
    tokenizer = load_run_tokenizer(cfg, path)
    dp = DataParallel(rank=env.rank, size=env.world)  # every process; the default group when there are several
    plays: list[dict[str, Any]] = []
    with plays_recorded(plays) if per_game else contextlib.nullcontext():
        metrics = evaluate_policy(cfg, model, tokenizer, split if split in ("train", "test") else "eval", dp=dp)
    if env.is_main:
        print(json.dumps(metrics, indent=1))
        paths.root.mkdir(parents=True, exist_ok=True)  # a policy that never ran here (init_from, model.path) has none
        write_json(paths.eval(split), {**metrics, "per_game": plays} if per_game else metrics)
    return 0
