"""The copy warm-up's loss at every step (sft/copy_warmup.py): where the demo's decoder grows induction heads.

    python -m experiments.copy_warmup [--run runs/demo_cpu] [--steps 800] [--config configs/demo_cpu.yaml]

Builds the demo's tiny decoder at run.seed (sft/tiny_model.py) over the tokenizer a demo run trained (RUN/tokenizer),
runs `--steps` steps of the copy task at the demo's lr and seed, and writes results/copy_warmup.json (the loss of
every step, and its mean over each 50 steps) and the table of those means. The loss falls as a phase change when
the heads form; the demo's `sft.copy_warmup_steps` must end after it (configs/demo_cpu.yaml).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.common import write_results
from experiments import RESULTS_DIR
from seedfast.config import load_config
from seedfast.model.tokenizer import load_tokenizer
from seedfast.sft.copy_warmup import copy_warmup
from seedfast.sft.tiny_model import initial_model
from seedfast.sft.tokenizer import ordinary_ids

WINDOW = 50  # steps per mean in the table and in window_means


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/demo_cpu.yaml")
    parser.add_argument("--run", default="runs/demo_cpu", help="a demo run folder with its trained tokenizer")
    parser.add_argument("--steps", type=int, default=800)
    args = parser.parse_args()
    cfg = load_config(args.config)
    tokenizer = load_tokenizer(Path(args.run) / "tokenizer")
    model = initial_model(cfg, tokenizer)
    losses: list[float] = []
    t = time.perf_counter()
    copy_warmup(model, ordinary_ids(tokenizer), args.steps, lr=cfg.sft.lr, seed=cfg.run.seed,
                log_fn=lambda row: losses.append(row["loss"]))
    wall = time.perf_counter() - t
    # one step's loss moves by ~0.1-0.2 from its fresh examples: the table reads means over 50 steps
    windows = {f"{start + 1}-{start + WINDOW}": sum(losses[start:start + WINDOW]) / WINDOW
               for start in range(0, args.steps - WINDOW + 1, WINDOW)}
    print(f"{'steps':>9s} {'mean copy loss':>14s}")
    for span, value in windows.items():
        print(f"{span:>9s} {value:14.3f}")
    path = write_results("copy_warmup", {
        "config": args.config, "run": args.run, "seed": cfg.run.seed, "lr": cfg.sft.lr, "steps": args.steps,
        "demo_steps": cfg.sft.copy_warmup_steps, "vocab_size": len(tokenizer), "threads": torch.get_num_threads(),
        "wall_s": wall, "window_means": windows, "loss": losses},
        packages=("torch", "tokenizers"), directory=RESULTS_DIR)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
