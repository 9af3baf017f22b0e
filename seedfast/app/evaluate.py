"""`seedfast eval RUN [--split train|eval]`: the run's exported policy (hf/, else its SFT output sft/) on the
train or held-out games, one greedy-by-default trajectory per game (train/evaluate.py); writes eval_<split>.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from seedfast.config import Config, ConfigError
from seedfast.runtime.setup import device_of, load_policy, load_run_tokenizer, load_tasks
from seedfast.train.evaluate import evaluate


def main(cfg: Config, split: str = "eval", **_: Any) -> int:
    run_dir = Path(cfg.run_dir)
    path = next((p for p in (run_dir / "hf", run_dir / "sft") if (p / "config.json").is_file()), None)
    if path is None:
        raise ConfigError(f"run.name: {run_dir} has no exported policy (hf/ or sft/) to evaluate")
    device = device_of(cfg)
    model = load_policy(cfg, path, device, trainable=False)
    tokenizer = load_run_tokenizer(cfg, path)
    tasks = load_tasks(cfg, "train" if split == "train" else "eval")
    metrics = evaluate(cfg, model, tokenizer, tasks, seed=cfg.run.seed)
    print(json.dumps(metrics, indent=1))
    (run_dir / f"eval_{split}.json").write_text(json.dumps(metrics, indent=1))
    return 0
