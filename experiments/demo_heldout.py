"""The demo's held-out numbers with more plays: `seedfast eval` of finished demo runs' policies (the SFT start,
then each algorithm's export) with trainer.eval_repeats=REPEATS, as `make demo` now evaluates (docs/demo.md).

    python -m experiments.demo_heldout demo_cpu_seed0 demo_cpu_seed1 demo_cpu_seed2

Each policy is evaluated by the command users run, in its own process, on the run's own config with only the
repeats overridden; the RL runs are not repeated (evaluation changes nothing they trained). Writes
experiments/results/demo_heldout.json: per run the SFT start's and each algorithm's eval/* metrics, the changes
from the start, and their means.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.common import print_table, write_results
from experiments import RESULTS_DIR

ROOT = Path(__file__).resolve().parents[1]
REPEATS = 4
ALGORITHMS = ("grpo", "seed")


def seedfast_eval(run: Path, name: str) -> dict[str, float]:
    """`seedfast eval` of the run folder runs/<name> (its hf/, else its sft/) with the demo run's config."""
    subprocess.run([sys.executable, "-m", "seedfast", "eval", str(run / "config.yaml"), f"run.name={name}",
                    f"trainer.eval_repeats={REPEATS}", "log.progress=false"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    return json.loads((ROOT / "runs" / name / "eval_eval.json").read_text())


def main(run_names: list[str]) -> None:
    runs: dict[str, dict] = {}
    for name in run_names:
        run = ROOT / "runs" / name
        before = seedfast_eval(run, name)
        after = {a: seedfast_eval(run, f"{name}/{a}") for a in ALGORITHMS}
        runs[name] = {"before": before, "after": after,
                      "change": {a: after[a]["eval/success_rate"] - before["eval/success_rate"] for a in ALGORITHMS}}
        print(name, before["eval/success_rate"], {a: m["eval/success_rate"] for a, m in after.items()}, flush=True)
    means = {"before": sum(r["before"]["eval/success_rate"] for r in runs.values()) / len(runs),
             **{a: sum(r["after"][a]["eval/success_rate"] for r in runs.values()) / len(runs) for a in ALGORITHMS},
             **{f"change {a}": sum(r["change"][a] for r in runs.values()) / len(runs) for a in ALGORITHMS}}
    rows = [{"run": n, "SFT": f"{r['before']['eval/success_rate']:.3f}",
             **{a.upper(): f"{r['after'][a]['eval/success_rate']:.3f} ({r['change'][a]:+.3f})" for a in ALGORITHMS}}
            for n, r in runs.items()]
    rows.append({"run": "mean", "SFT": f"{means['before']:.3f}",
                 **{a.upper(): f"{means[a]:.3f} ({means[f'change {a}']:+.3f})" for a in ALGORITHMS}})
    print_table(rows, ["run", "SFT", *(a.upper() for a in ALGORITHMS)],
                title=f"held-out success, 128 games x {REPEATS} plays (seedfast eval)")
    write_results("demo_heldout", {"command": "python -m experiments.demo_heldout " + " ".join(run_names),
                                   "eval_repeats": REPEATS, "runs": runs, "means": means},
                  packages=("torch", "textworld", "seedfast"), directory=RESULTS_DIR)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    main(sys.argv[1:])
