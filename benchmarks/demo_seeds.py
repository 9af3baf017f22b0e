"""`make demo` at several seeds: the three-seed table and plot of the README.

    python benchmarks/demo_seeds.py [--seeds 0 1 2] [--name demo_seeds] [--config ...] [--collect-only] [overrides]

Runs `seedfast demo CONFIG run.seed=S run.name=demo_cpu_seedS` for each seed, one after another (each run in
its own process, as a user would), then reads each run's demo_summary.json and writes demo_seeds.json (per
seed and mean/min/max: held-out success before and after, training-pool success over the first quarter and
the last half of the updates for each algorithm and the no-learning control, wall time) and demo_seeds.png
(pool success per update, mean over seeds with the min-max band). The games are shared: the config's
env.games_dir is the same for every seed, so only the first run generates them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, write_results  # noqa: E402

from seedfast.config import load_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def run_name(config: str, seed: int, tag: str = "") -> str:
    """The run folder of one seed: the config's file name, a tag if any, and the seed (demo_cpu_seed0,
    smollm2-135m_textworld_cpu_sparse_self_seed1, ...)."""
    return f"{Path(config).stem}{f'_{tag}' if tag else ''}_seed{seed}"


def run_seed(config: str, seed: int, extra: list[str], tag: str = "") -> tuple[Path, float]:
    name = run_name(config, seed, tag)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "seedfast", "demo", config, f"run.seed={seed}", f"run.name={name}", *extra],
                   cwd=ROOT, check=True)
    return ROOT / "runs" / name, time.perf_counter() - t


def spread(values: list[float]) -> dict[str, float]:
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}


def summarize(runs: dict[int, dict]) -> dict:
    first = next(iter(runs.values()))
    curves = list(first["pool_success"])
    algorithms = list(first["after"])
    out: dict = {"held-out SFT": spread([r["before"]["eval/success_rate"] for r in runs.values()]),
                 "random floor": spread([r["random_floor"] for r in runs.values()]),
                 "wall_s": spread([r["wall_s"] for r in runs.values()])}
    for a in algorithms:
        out[f"held-out {a} after"] = spread([r["after"][a]["eval/success_rate"] for r in runs.values()])
    for c in curves:
        for part in ("first_quarter", "last_half"):
            out[f"pool {c} {part}"] = spread([r["means"][c][part] for r in runs.values()])
    return out


def plot(runs: dict[int, dict], path: Path, temperature: float = 1.0) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = next(iter(runs.values()))
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name in first["pool_success"]:
        curves = [r["pool_success"][name] for r in runs.values()]
        n = min(len(c) for c in curves)
        steps = list(range(1, n + 1))
        mean = [sum(c[i] for c in curves) / len(curves) for i in range(n)]
        style = dict(color="grey", linestyle="--") if name == "control" else {}
        ax.plot(steps, mean, marker="o", label=f"{name} (mean of {len(curves)} seeds)", **style)
        ax.fill_between(steps, [min(c[i] for c in curves) for i in range(n)],
                        [max(c[i] for c in curves) for i in range(n)], alpha=0.15, **({"color": "grey"} if
                                                                                     name == "control" else {}))
    ax.set_xlabel("RL update")
    ax.set_ylabel(f"training-pool success (T={temperature:g})")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"seeds {', '.join(map(str, runs))}: mean and min-max band")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def collect(config: str, seeds: list[int], overrides: list[str], collect_only: bool,
            more: Callable[[Path], dict] | None = None, tag: str = "") -> dict[int, dict]:
    """Each seed's demo_summary.json (the run made first unless collect_only), with its wall time and what `more`
    reads from the run folder."""
    runs = {}
    for seed in seeds:
        run_dir = ROOT / "runs" / run_name(config, seed, tag)
        wall = None
        if not collect_only:
            run_dir, wall = run_seed(config, seed, overrides, tag)
        summary = json.loads((run_dir / "demo_summary.json").read_text())
        summary["wall_s"] = wall if wall is not None else sum(summary["timings"].values())
        runs[seed] = {**summary, **(more(run_dir) if more else {})}
    return runs


def report(name: str, config: str, overrides: list[str], runs: dict[int, dict]) -> Path:
    """results/NAME.json and NAME.png, and the summary table on stdout."""
    result = {"config": config, "overrides": overrides, "seeds": list(runs),
              "summary": summarize(runs), "runs": {str(k): v for k, v in runs.items()}}
    path = write_results(name, result, packages=("torch", "transformers", "tokenizers", "textworld"))
    plot(runs, RESULTS_DIR / f"{name}.png", load_config(ROOT / config).rollout.temperature)
    print(f"{'what':40s} {'mean':>7s} {'min':>7s} {'max':>7s}")
    for key, v in result["summary"].items():
        print(f"{key:40s} {v['mean']:7.3f} {v['min']:7.3f} {v['max']:7.3f}")
    print(f"wrote {path} and {RESULTS_DIR / f'{name}.png'}")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", default="configs/demo_cpu.yaml")
    parser.add_argument("--collect-only", action="store_true", help="summarize runs that already exist")
    parser.add_argument("--name", default="demo_seeds", help="results/NAME.json and NAME.png")
    parser.add_argument("overrides", nargs="*", help="dotted overrides passed to every run")
    args = parser.parse_args()
    report(args.name, args.config, args.overrides, collect(args.config, args.seeds, args.overrides, args.collect_only))


if __name__ == "__main__":
    main()
