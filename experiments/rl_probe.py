"""RL probe: the RL half of `make demo` from an SFT start that already exists, with dotted overrides.

    python -m experiments.rl_probe SFT_RUN NAME [overrides ...]   # e.g. demo_cpu_seed2 p64 rollout.task_pool=64

SFT_RUN is a finished demo run (runs/SFT_RUN/sft holds its SFT policy). Trains each algorithm of
demo.algorithms from that start exactly as the demo does, rolls out the no-learning control on the same draws,
evaluates held-out success the demo's way (train/evaluate.py evaluate_policy: every held-out game
trainer.eval_repeats times at rollout.eval_temperature) and prints, per algorithm, training-pool success over the
first quarter and the last half of the updates beside the control's, held-out success before and after, and the mean
over updates of the report's evidence metrics (app/report.py EVIDENCE: the teacher's win-lose contrast, the shares
of tokens it raises, its share of the update, ...). Appends one JSON line per run,
with the machine and versions, to experiments/results/rl_probe.jsonl. This is how the demo's RL pool was chosen
(docs/demo.md): a second SFT is not needed to try an RL setting.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

from benchmarks.common import git_commit, machine_info, print_table, versions
from experiments import RESULTS_DIR
from seedfast.app.report import EVIDENCE
from seedfast.config import load_config
from seedfast.runtime.setup import device_of, load_policy, load_run_tokenizer
from seedfast.train.evaluate import evaluate_policy, evaluation_tasks
from seedfast.train.rl import Trainer

ROOT = Path(__file__).resolve().parents[1]


def first_quarter_last_half(curve: list[float]) -> tuple[float, float]:
    n = len(curve)
    quarter, half = curve[: max(1, n // 4)], curve[n // 2:]
    return sum(quarter) / len(quarter), sum(half) / len(half)


def main(sft_run: str, name: str, overrides: list[str]) -> dict:
    cfg = load_config(ROOT / "configs" / "demo_cpu.yaml",
                      ["log.progress=false", "log.tensorboard=false", f"run.name=rl_probe_{name}", *overrides])
    sft_dir = ROOT / cfg.run.out_dir / sft_run / "sft"
    if not (sft_dir / "config.json").exists():
        raise SystemExit(f"rl_probe: no SFT policy in {sft_dir} (run `seedfast demo ... run.name={sft_run}` first)")
    eval_tasks = evaluation_tasks(cfg, "eval")
    start = load_policy(cfg, sft_dir, device_of(cfg), trainable=False)
    tokenizer = load_run_tokenizer(cfg, sft_dir)
    before = evaluate_policy(cfg, start, tokenizer, "eval")["eval/success_rate"]

    runs: dict[str, dict] = {}
    for algorithm in [*cfg.demo.algorithms, "control"]:
        t = time.perf_counter()
        sub = copy.deepcopy(cfg)
        if algorithm == "control":
            sub.algorithm, sub.loss.kl_coef = "grpo", 0.0
        else:
            sub.algorithm, sub.trainer.init_from = algorithm, str(sft_dir)
        trainer = Trainer(sub, policy_dir=sft_dir, run_dir=cfg.run_dir / algorithm)
        try:
            history = trainer.control_run() if algorithm == "control" else trainer.run()
            after = None if algorithm == "control" else history[-1]["eval/success_rate"]  # the trainer's last eval
        finally:
            trainer.close()
        evidence = {k: sum(r[k] for r in history if k in r) / sum(k in r for r in history)
                    for k in EVIDENCE if any(k in r for r in history)}
        runs[algorithm] = {"pool_success": [r["train/success_rate"] for r in history], "heldout_after": after,
                           "evidence": evidence, "wall_s": round(time.perf_counter() - t, 1)}

    control_half = first_quarter_last_half(runs["control"]["pool_success"])[1]
    rows = []
    for algorithm, r in runs.items():
        quarter, half = first_quarter_last_half(r["pool_success"])
        r.update(first_quarter=quarter, last_half=half)
        rows.append({"run": algorithm, "pool first quarter": f"{quarter:.3f}", "pool last half": f"{half:.3f}",
                     "control last half": f"{control_half:.3f}", "held-out before": f"{before:.3f}",
                     "held-out after": "-" if r["heldout_after"] is None else f"{r['heldout_after']:.3f}",
                     "wall s": r["wall_s"]})
    print_table(rows, list(rows[0]), title=f"rl_probe {name} from {sft_run} {' '.join(overrides)}")
    for algorithm, r in runs.items():
        if r["evidence"]:
            print(algorithm, " ".join(f"{k}={v:.3f}" for k, v in r["evidence"].items()))
    record = {"name": name, "sft_run": sft_run, "overrides": overrides, "heldout_before": before,
              # evaluation_tasks lists the games trainer.eval_repeats times: the plays the evaluation made
              "heldout_games": len(eval_tasks) // cfg.trainer.eval_repeats,
              "heldout_repeats": cfg.trainer.eval_repeats, "runs": runs,
              "git_commit": git_commit(), "machine": machine_info(), "versions": versions("torch", "seedfast")}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    with open(RESULTS_DIR / "rl_probe.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    return record


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
