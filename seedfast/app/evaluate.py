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
"""

from __future__ import annotations

import json
from typing import Any

from seedfast.app.report import write_json
from seedfast.config import Config
from seedfast.distributed.data import DataParallel
from seedfast.runtime.paths import RunPaths
from seedfast.runtime.setup import device_of, load_policy, load_run_tokenizer, start_processes, trained_policy_path
from seedfast.train.evaluate import evaluate_policy


def main(cfg: Config, split: str = "eval", **_: Any) -> int:
    env = start_processes(cfg, "eval")  # one process, or this rank of torchrun's (docs/scaling.md)
    paths = RunPaths.of(cfg)
    path = trained_policy_path(cfg)  # hf/, else init_from / sft/ / model.path: a base model is measured too
    device = device_of(cfg)
    model = load_policy(cfg, path, device, trainable=False)
    tokenizer = load_run_tokenizer(cfg, path)
    dp = DataParallel(rank=env.rank, size=env.world)  # every process; the default group when there are several
    metrics = evaluate_policy(cfg, model, tokenizer, "train" if split == "train" else "eval", dp=dp)
    if env.is_main:
        print(json.dumps(metrics, indent=1))
        paths.root.mkdir(parents=True, exist_ok=True)  # a policy that never ran here (init_from, model.path) has none
        write_json(paths.eval(split), metrics)
    return 0
