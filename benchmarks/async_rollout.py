"""Where asynchronous rollouts pay, measured (issue 34, point 6): the demo's model and pool, one-step-off
(`rollout.max_staleness=1`) against the synchronous loop at the same seed: updates per minute and pool success per
update (docs/architecture.md, 'Asynchronous rollouts').

    seedfast sft configs/demo_cpu.yaml run.name=demo_cpu              # the demo's SFT start, if there is none yet
    python -m benchmarks.async_rollout --policy runs/demo_cpu/sft --games-dir runs/demo_cpu/games --steps 16
    python -m benchmarks.async_rollout ... --step-delay 0.2           # a slower environment than TextWorld

First it measures TextWorld's own step cost on the pool's games (seconds per `env.step`, in this process), then runs
each mode in this process with the same config and seed (GRPO by default, `--algorithm`), the held-out evaluation
off. `--step-delay` adds that many seconds to every environment step (env.step_delay_s), for environments slower than
the demo's games. Updates per minute count the training loop's time (the sum of `time/step`: for the asynchronous run
the wait for the producer, the update and the weight send), not the start-up both share; update 0 of the
asynchronous run includes the producer's own start, so the table also gives the rate after the first update. Writes
benchmarks/results/<name>.json (machine and versions with it) and <name>.png, and prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchmarks.common import RESULTS_DIR, print_table, wrap_paragraph, write_results
from seedfast.config import load_config
from seedfast.runtime.setup import load_tasks
from seedfast.train.rl import Trainer

ROOT = Path(__file__).resolve().parents[1]
PER_UPDATE = ("train/success_rate", "time/step", "time/rollout", "time/rollout_wait", "time/update",
              "rollout/staleness_mean", "async/push_seconds")


def measure_env_step(cfg, games: int, steps: int) -> dict:
    """Seconds per TextWorld step on `games` training games, `steps` actions each (the admissible ones in turn)."""
    from seedfast.envs.textworld_env import TextWorldEnv

    times: list[float] = []
    for task in load_tasks(cfg, "train")[:games]:
        env = TextWorldEnv(task.spec)
        obs = env.reset()
        for i in range(steps):
            action = obs.admissible_actions[i % len(obs.admissible_actions)] if obs.admissible_actions else "look"
            t = time.perf_counter()
            obs, _, done, _ = env.step(action)
            times.append(time.perf_counter() - t)
            if done:
                obs = env.reset()
        env.close()
    return {"env_step_s_mean": statistics.fmean(times), "env_step_s_median": statistics.median(times),
            "env_steps_timed": len(times)}


def run_mode(config: Path, overrides: list[str], staleness: int, run_dir: Path) -> list[dict]:
    cfg = load_config(config, [*overrides, f"rollout.max_staleness={staleness}", f"run.out_dir={run_dir}",
                               f"run.name=s{staleness}"])
    trainer = Trainer(cfg)
    try:
        history = trainer.run()
    finally:
        trainer.close()
    return [{"step": r["step"], **{k: r[k] for k in PER_UPDATE if k in r}} for r in history]


def summarize(name: str, rows: list[dict]) -> dict:
    loop_s = sum(r["time/step"] for r in rows)
    steady_s = sum(r["time/step"] for r in rows[1:])  # update 0 of the asynchronous run waits for the producer's start
    success = [r["train/success_rate"] for r in rows]
    return {"mode": name, "updates": len(rows), "loop_s": loop_s, "updates_per_min": 60 * len(rows) / loop_s,
            "updates_per_min_after_first": 60 * (len(rows) - 1) / steady_s if len(rows) > 1 else None,
            "s_per_update": loop_s / len(rows), "pool_success_mean": statistics.fmean(success),
            "pool_success_last4": statistics.fmean(success[-4:]),
            "wait_s_mean": statistics.fmean(r.get("time/rollout_wait", 0.0) for r in rows)}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in result["runs"].items():
        elapsed, total = [], 0.0
        for r in rows:
            total += r["time/step"]
            elapsed.append(total / 60)
        steps = [r["step"] + 1 for r in rows]
        ax_t.plot(steps, elapsed, marker="o", label=name)
        ax_s.plot(steps, [r["train/success_rate"] for r in rows], marker="o", label=name)
    ax_t.set(xlabel="update", ylabel="training-loop minutes", title="time to reach each update")
    ax_s.set(xlabel="update", ylabel="pool success (the update's rollouts)", title="success per update, same seed")
    for ax in (ax_t, ax_s):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend()
    env = result["env"]
    fig.suptitle(f"one-step-off vs synchronous, {result['config']['algorithm']}, TextWorld step "
                 f"{1000 * env['env_step_s_mean']:.1f} ms + delay {1000 * result['config']['step_delay_s']:.0f} ms")
    fig.tight_layout()
    fig.savefig(path, dpi=120)




def overlap_bound(rows: list[dict]) -> tuple[float, float]:
    """From the synchronous run (the first update left out): the rollout's share r of an update, and the speed-up
    a perfect overlap of the rollout with the rest of the update would give, 1 / max(r, 1 - r)."""
    later = rows[1:] or rows
    share = sum(r["time/rollout"] for r in later) / sum(r["time/step"] for r in later)
    return share, 1 / max(share, 1 - share)


def markdown(result: dict) -> str:
    """docs/architecture.md's read-out of results/<name>.json (`make docs` writes it there; tests/test_docs_generated.py
    regenerates it and compares)."""
    sync, stale = result["summary"]
    share, bound = overlap_bound(result["runs"][sync["mode"]])
    cfg, machine = result["config"], result["machine"]
    text = (
        f"Measured (`benchmarks/results/{result['benchmark']}.json` and `.png`, `{result['command']}`): the demo's SFT "
        f"start and pool, {cfg['algorithm'].upper()}, {cfg['steps']} updates at seed {cfg['seed']}, on "
        f"{machine.get('cpu', '?')} ({machine.get('cpu_count', '?')} cores). A TextWorld step costs "
        f"{1000 * result['env']['env_step_s_mean']:.1f} ms, so the rollout is the policy's generation. The synchronous "
        f"loop made {sync['updates_per_min']:.2f} updates a minute, one-step-off (`rollout.{stale['mode']}`) "
        f"{stale['updates_per_min']:.2f} "
        f"({stale['updates_per_min'] / sync['updates_per_min']:.2f}x; after the first update, which holds the "
        f"producer's start, {sync['updates_per_min_after_first']:.2f} against "
        f"{stale['updates_per_min_after_first']:.2f}, "
        f"{stale['updates_per_min_after_first'] / sync['updates_per_min_after_first']:.2f}x), the trainer waiting "
        f"{stale['wait_s_mean']:.2f} s an update for its batch. In the synchronous loop the rollout is {share:.0%} of "
        f"an update, so a perfect overlap would give at most {bound:.2f}x; here the producer and the trainer share the "
        f"same {machine.get('cpu_count', '?')} cores, competing for them where a cluster gives each its own. Pool "
        "success per update, mean "
        f"over the run: {sync['pool_success_mean']:.3f} synchronous, {stale['pool_success_mean']:.3f} one-step-off "
        f"(last 4 updates {sync['pool_success_last4']:.3f} and {stale['pool_success_last4']:.3f}): one seed on the "
        "same draws, so whether one step of staleness costs learning here is not settled by it. A prediction, not a "
        "measurement: where the "
        "producer has devices of its own (a GPU cluster's rollout and training pools), the same bound "
        "1 / max(r, 1 − r) holds with that cluster's own rollout share r, so the gain is largest where rollout and "
        "training take about the same time (r = 0.5: 2x) and small where either dominates.")
    return wrap_paragraph(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "demo_cpu.yaml")
    p.add_argument("--policy", type=Path, default=ROOT / "runs" / "demo_cpu" / "sft", help="the SFT start (HF)")
    p.add_argument("--games-dir", type=Path, default=ROOT / "runs" / "demo_cpu" / "games")
    p.add_argument("--steps", type=int, default=16, help="updates per mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--algorithm", default="grpo")
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds added to every environment step")
    p.add_argument("--staleness", type=int, default=1, help="the asynchronous run's rollout.max_staleness")
    p.add_argument("--name", default="async_rollout", help="results/<name>.json and .png")
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "async_rollout", help="the runs' folders")
    p.add_argument("--set", nargs="*", default=[], help="more config overrides (key=value), for both modes")
    args = p.parse_args(argv)
    if not (args.policy / "config.json").is_file():
        p.error(f"--policy {args.policy}: no HF folder; make the demo's SFT start first (the module docstring)")
    overrides = [f"trainer.init_from={args.policy}", f"env.games_dir={args.games_dir}", f"run.seed={args.seed}",
                 f"algorithm={args.algorithm}", f"trainer.steps={args.steps}", "trainer.eval_every=0",
                 "trainer.eval_games=1", "trainer.eval_repeats=1", "trainer.checkpoint_every=0",
                 "log.progress=false", "log.tensorboard=false", f"env.step_delay_s={args.step_delay}", *args.set]
    env = measure_env_step(load_config(args.config, overrides), games=4, steps=8)
    print(f"TextWorld step: {1000 * env['env_step_s_mean']:.2f} ms mean over {env['env_steps_timed']} steps")
    runs = {}
    for name, staleness in (("synchronous", 0), (f"max_staleness={args.staleness}", args.staleness)):
        runs[name] = run_mode(args.config, overrides, staleness, args.work / args.name)
    summary = [summarize(name, rows) for name, rows in runs.items()]
    result = {"config": {"config": str(args.config), "policy": str(args.policy), "steps": args.steps,
                         "seed": args.seed, "algorithm": args.algorithm, "step_delay_s": args.step_delay,
                         "staleness": args.staleness, "overrides": overrides},
              "env": env, "summary": summary, "runs": runs}
    path = write_results(args.name, result)
    plot(result, RESULTS_DIR / f"{args.name}.png")
    print_table(summary, ["mode", "updates", "loop_s", "updates_per_min", "updates_per_min_after_first",
                          "s_per_update", "wait_s_mean",
                          "pool_success_mean", "pool_success_last4"], title=f"{path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
