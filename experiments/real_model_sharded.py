"""The real-model recipe under torchrun: SmolLM2-135M, SEED, FSDP2 mixed precision on 2 CPU ranks (gloo), beside
one process, and a resume from the sharded run's DCP checkpoint (issue #21, point 4).

    python -m experiments.real_model_sharded [--policy runs/smollm2-135m_textworld_cpu_seed0/sft] [--steps 2]

1. `torchrun --nproc-per-node 2 -m seedfast train CONFIG dist.strategy=fsdp model.dtype=bf16` for --steps updates
   from the SFT policy (fp32 master weights and AdamW states, bf16 compute, gradients reduced in fp32), a checkpoint
   after every update;
2. the same command with one more update and `trainer.resume=auto`: it must start at the last checkpoint's step,
   neither losing nor repeating one;
3. one process, `dist.strategy=none`, the same precision, the same updates.
Writes results/real_model_sharded.json: per update and per run, the loss, success, skill parse rate and seconds.
The two ranks roll out different games with their own sampling seeds, so the runs' numbers are not expected to be
equal: equality of one update on the same samples is tests/distributed/test_real_model_sharded.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import write_results
from experiments import RESULTS_DIR

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/smollm2-135m_textworld_cpu.yaml"
KEYS = ("loss/total", "loss/opd_term", "train/success_rate", "skill/parse_rate", "optim/grad_norm", "time/step",
        "eval/success_rate")


def train(name: str, steps: int, policy: str, ranks: int, extra: list[str]) -> tuple[list[dict], float]:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)] if ranks > 1
                else [sys.executable])
    cmd = [*launcher, "-m", "seedfast", "train", CONFIG, f"run.name={name}", f"model.path={policy}",
           "model.dtype=bf16", "optim.master_dtype=fp32", "algorithm=seed", f"trainer.steps={steps}",
           "trainer.checkpoint_every=1", "log.tensorboard=false", "log.progress=false",
           f"dist.strategy={'fsdp' if ranks > 1 else 'none'}", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // ranks))}
    t = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    wall = time.perf_counter() - t
    rows = [json.loads(line) for line in (ROOT / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    return [{"step": r["step"], **{k: r[k] for k in KEYS if k in r}} for r in rows], wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="runs/smollm2-135m_textworld_cpu_seed0/sft")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    if not (ROOT / args.policy / "config.json").is_file():
        sys.exit(f"{args.policy} is not an HF folder: run experiments/real_model.py --seeds 0 first (its SFT policy)")
    sharded, sharded_s = train("real_model_fsdp2", args.steps, args.policy, 2, [])
    resumed, resumed_s = train("real_model_fsdp2", args.steps + 1, args.policy, 2, ["trainer.resume=auto"])
    one, one_s = train("real_model_one_process", args.steps, args.policy, 1, [])
    steps_after_resume = [r["step"] for r in resumed]
    result = {"config": CONFIG, "policy": args.policy, "updates": args.steps,
              "precision": "fp32 master weights and AdamW states, bf16 compute, fp32 gradient reduction",
              "two_ranks": {"rows": sharded, "wall_s": sharded_s},
              "resumed": {"rows": resumed, "wall_s": resumed_s, "steps": steps_after_resume,
                          "continued_without_loss_or_repeat": steps_after_resume == list(range(args.steps + 1))},
              "one_process": {"rows": one, "wall_s": one_s}}
    path = write_results("real_model_sharded", result, packages=("torch", "transformers", "seedfast"),
                         directory=RESULTS_DIR)
    for name in ("two_ranks", "resumed", "one_process"):
        for r in result[name]["rows"]:
            print(name, {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()})
    print(f"resume continued without a lost or repeated step: {result['resumed']['continued_without_loss_or_repeat']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
