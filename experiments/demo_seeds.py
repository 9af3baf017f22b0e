"""`make demo` at several seeds: the three-seed table and plot of the README.

    python -m experiments.demo_seeds [--seeds 0 1 2] [--name demo_seeds] [--config ...] [--collect-only] [overrides]

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
import math
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import wrap_paragraph, write_results
from experiments import RESULTS_DIR
from seedfast.config import load_config

ROOT = Path(__file__).resolve().parents[1]
FRESH = "demo_fresh_clone"  # `make demo` on a fresh clone at seed 0: results/demo_fresh_clone.json


def run_name(config: str, seed: int, tag: str = "") -> str:
    """The run folder of one seed: the config's file name, a tag if any, and the seed (demo_cpu_seed0,
    smollm2-135m_textworld_cpu_sparse_self_seed1, ...)."""
    return f"{Path(config).stem}{f'_{tag}' if tag else ''}_seed{seed}"


def run_seed(config: str, seed: int, extra: list[str], tag: str = "", root: Path = ROOT,
             env: dict[str, str] | None = None) -> tuple[Path, float]:
    """`seedfast demo CONFIG run.seed=S run.name=...` in `root` (this tree, or a clone of it) with this Python: the
    run folder and the wall time of the whole process, as a user waits for it."""
    name = run_name(config, seed, tag)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "seedfast", "demo", config, f"run.seed={seed}", f"run.name={name}", *extra],
                   cwd=root, check=True, env=env)
    return root / "runs" / name, time.perf_counter() - t


def read_summary(run_dir: Path, wall: float | None) -> dict:
    """A run's demo_summary.json with its wall time: `wall` as measured around the process, else the sum of the
    run's own timings (a run made earlier)."""
    summary = json.loads((run_dir / "demo_summary.json").read_text())
    summary["wall_s"] = wall if wall is not None else sum(summary["timings"].values())
    return summary


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
    plot_panels([(runs, temperature, None)], path)


def plot_panels(panels: list[tuple[dict, float, str | None]], path: Path) -> None:
    """One figure, side by side, a panel per (runs, temperature, title): what `plot` draws for one set of runs (the
    title None: the seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 3.8), squeeze=False)
    for ax, (runs, temperature, title) in zip(axes[0], panels):
        draw(ax, runs, temperature, title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw(ax, runs: dict, temperature: float = 1.0, title: str | None = None) -> None:
    """Pool success per update on one axis: each lane's mean over the seeds, with the min-max band."""
    first = next(iter(runs.values()))
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
    ax.set_title(title or f"seeds {', '.join(map(str, runs))}: mean and min-max band")
    ax.legend(fontsize=8)


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
        summary = read_summary(run_dir, wall)
        runs[seed] = {**summary, **(more(run_dir) if more else {})}
    return runs


PACKAGES = ("torch", "transformers", "tokenizers", "textworld")  # the versions a result records


def result_of(config: str, overrides: list[str], runs: dict[int, dict]) -> dict:
    """What a results file holds of the runs (write_results adds the machine, versions, commit and command)."""
    return {"config": config, "overrides": overrides, "seeds": list(runs),
            "summary": summarize(runs), "runs": {str(k): v for k, v in runs.items()}}


def print_summary(result: dict) -> None:
    print(f"{'what':40s} {'mean':>7s} {'min':>7s} {'max':>7s}")
    for key, v in result["summary"].items():
        print(f"{key:40s} {v['mean']:7.3f} {v['min']:7.3f} {v['max']:7.3f}")


def report(name: str, config: str, overrides: list[str], runs: dict[int, dict]) -> Path:
    """results/NAME.json and NAME.png, and the summary table on stdout."""
    result = result_of(config, overrides, runs)
    path = write_results(name, result, packages=PACKAGES, directory=RESULTS_DIR)
    plot(runs, RESULTS_DIR / f"{name}.png", load_config(ROOT / config).rollout.temperature)
    print_summary(result)
    print(f"wrote {path} and {RESULTS_DIR / f'{name}.png'}")
    return path


def change_standard_error(p: float, games: int, plays: int) -> float:
    """The sampling standard error of a held-out change between two policies that each win a share `p` of
    `games` x `plays` episodes: sqrt(2 p (1 - p) / (games plays)) (the game set is the same for both, so only the
    plays' sampling differs)."""
    return math.sqrt(2 * p * (1 - p) / (games * plays))


def _signed(values: list[float]) -> str:
    """'+0.094, −0.051; mean +0.021': each seed's value, then the mean, signed with the docs' minus sign."""
    text = ", ".join(f"{v:+.3f}" for v in values) + f"; mean {sum(values) / len(values):+.3f}"
    return text.replace("-", "−")


JOB_NAMES = {"grpo": "GRPO", "seed": "SEED", "control": "the control", "eval_sft": "the SFT policy's evaluation"}
BUDGET_S = 600  # `make demo`'s budget on a 2-core CPU: 10 minutes (docs/demo.md)


def seeds_table(result: dict) -> str:
    """One row per seed: held-out success before and after, pool success (first quarter -> last half) for the
    control and each algorithm, groups with a win and a loss, wall time."""
    runs = result["runs"]
    algorithms = list(next(iter(runs.values()))["after"])
    names = " / ".join(["control", *(a.upper() for a in algorithms)])
    head = (f"| run.seed | random floor | SFT held-out | {' | '.join(f'{a.upper()} after' for a in algorithms)} | "
            f"pool success, first quarter → last half: {names} | groups with a win and a loss: "
            f"{' / '.join(a.upper() for a in algorithms)} | wall time |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for seed, run in runs.items():
        pools = " / ".join(f"{run['means'][c]['first_quarter']:.3f} → {run['means'][c]['last_half']:.3f}"
                           for c in ["control", *algorithms])
        signal = " / ".join(f"{run['seed_metrics'][a]['train/groups_with_signal']:.2f}" for a in algorithms)
        lines.append(f"| {seed} | {run['random_floor']:.3f} | {run['before']['eval/success_rate']:.3f} | "
                     + " | ".join(f"{run['after'][a]['eval/success_rate']:.3f}" for a in algorithms)
                     + f" | {pools} | {signal} | "
                     f"{run['wall_s'] / 60:.1f} min |")
    return "\n".join(lines)


def readout(result: dict) -> dict:
    """What the table says, per seed in its order: each algorithm's pool lead over the control (last half), its
    held-out change from the SFT start, and SEED - GRPO on both."""
    runs = list(result["runs"].values())
    algorithms = list(runs[0]["after"])
    out: dict = {"lead": {}, "heldout_change": {}}
    for a in algorithms:
        out["lead"][a] = [r["means"][a]["last_half"] - r["means"]["control"]["last_half"] for r in runs]
        out["heldout_change"][a] = [r["after"][a]["eval/success_rate"] - r["before"]["eval/success_rate"]
                                    for r in runs]
    if {"seed", "grpo"} <= set(algorithms):
        out["seed_minus_grpo"] = {
            "pool_last_half": [r["means"]["seed"]["last_half"] - r["means"]["grpo"]["last_half"] for r in runs],
            "heldout": [r["after"]["seed"]["eval/success_rate"] - r["after"]["grpo"]["eval/success_rate"]
                        for r in runs]}
    return out


def markdown(seeds: dict, fresh: dict) -> str:
    """docs/demo.md, "Results": results/demo_seeds.json (the demo's job at several seeds) and
    results/demo_fresh_clone.json (`make demo` on a fresh clone), every number read from them (`make docs` writes it
    there; tests/test_docs_generated.py regenerates it and compares)."""
    runs = list(seeds["runs"].values())
    held_out = runs[0]["held_out"]
    said = readout(seeds)
    n = len(runs)
    sft_mean = sum(r["before"]["eval/success_rate"] for r in runs) / n
    se = change_standard_error(sft_mean, held_out["games"], held_out["plays"])
    fresh_run = fresh["runs"]["0"]
    timings, jobs = fresh_run["timings"], fresh_run["job_seconds"]
    rl = re.sub(r", seed \d+", "", runs[0]["setup"]["RL"])  # the setup line of the first seed, for every seed
    parts = [
        f"`python -m experiments.demo_seeds --seeds {' '.join(map(str, seeds['seeds']))}` "
        f"(`experiments/results/demo_seeds.json` and `.png`; {seeds['machine']['cpu']}, "
        f"{seeds['machine']['cpu_count']} cores) ran `make demo`'s job at each seed, one after another, the games "
        f"generated by the first: {runs[0]['setup']['games']}; {rl}; "
        f"{runs[0]['setup']['RL pool']}. Held-out success is at T={runs[0]['temperatures']['held_out']}, pool "
        f"success over each update's trajectories at T={runs[0]['temperatures']['pool']}.",
        seeds_table(seeds),
    ]
    lead_lines = []
    for a, leads in said["lead"].items():
        above = sum(v > 0 for v in leads)
        lead_lines.append(f"{a.upper()}'s pool success over the last half is above the no-learning control's at "
                          f"{above} of {n} seeds (by {_signed(leads)})")
    keys = ("teacher/contrast", "teacher/opd_share", "skill/parse_rate")
    mechanism = {k: sum(r["seed_metrics"]["seed"][k] for r in runs) / n for k in keys} if "seed" in said["lead"] else {}
    change_lines = [f"{a.upper()} ({_signed(v)})" for a, v in said["heldout_change"].items()]
    text = ("; ".join(lead_lines) + ". Held-out success after RL, change from the SFT start: "
            + ", ".join(change_lines) + f". At {held_out['games']} games × {held_out['plays']} plays one such change "
            f"has a sampling standard error of about {se:.3f} (at the SFT mean {sft_mean:.3f}).")
    if "seed_minus_grpo" in said:
        d = said["seed_minus_grpo"]
        text += (f" SEED − GRPO: pool last half ({_signed(d['pool_last_half'])}), held-out ({_signed(d['heldout'])}).")
    if mechanism:
        text += (f" SEED's teacher, means over updates and seeds: win−lose contrast of ℓskill − ℓθ "
                 f"{mechanism['teacher/contrast']:+.3f} nats, OPD term {mechanism['teacher/opd_share']:.1%} of the "
                 f"update (at the demo's `loss.opd_coef`, the release's weight), skills parsed "
                 f"{mechanism['skill/parse_rate']:.0%}: "
                 "at this weight SEED's update is GRPO's ('SEED in the sparse regime' below).")
    parts.append(text)
    parts.append(
        f"`make demo` on a fresh clone at seed 0 (`experiments/results/{FRESH}.json`, {fresh['machine']['cpu']}, "
        f"{fresh['machine']['cpu_count']} cores, commit {fresh['git_commit'][:7]}): {fresh_run['wall_s'] / 60:.1f} "
        f"min in all, {'inside' if fresh_run['wall_s'] <= BUDGET_S else 'over'} the {BUDGET_S // 60}-minute budget: "
        f"games {timings['games']:.0f} s, SFT {timings['sft']:.0f} s (its copy warm-up, "
        f"{fresh_run['sft_phases']['copy_warmup_steps']} steps of fixed shapes that gauge the box's speed at the "
        f"time, {fresh_run['sft_phases']['copy_warmup']:.0f} s), "
        "the jobs after SFT "
        f"{timings['after_sft']:.0f} s (each in its lane: "
        + ", ".join(f"{JOB_NAMES.get(k, k)} {v:.0f} s" for k, v in jobs.items()) + ").")
    return "\n\n".join(wrap_paragraph(p) for p in parts)


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
