"""Where does RL's held-out fall come from? The demo's policies (SFT start, GRPO, SEED) of finished demo runs,
evaluated the demo's way on four game sets:

- pool: the rollout.task_pool training games RL drew from (seen by SFT and RL);
- train, not pool: the other training games (seen by SFT only);
- held-out (demo): the demo's 32 held-out games of the time (seen by neither);
- held-out (more): EXTRA_EVAL_PER_LEVEL more held-out games per level, from the same seeds' continuation
  (generated into the run's games folder when missing; the demo's own games stay the first ones of each level).

    python -m experiments.generalization_probe demo_cpu_seed0 demo_cpu_seed1 demo_cpu_seed2

Memorizing the pool would lift the pool and leave the other sets flat or lower; a policy that got generally worse
would fall on every unseen set; a policy that got better would rise on them. The held-out (demo) set has 32
games, so its success has a standard error near 0.08 (docs/demo.md): the larger sets decide. Writes
experiments/results/generalization_probe.json (per run, policy and set: success, invalid rate, episode length,
games, episodes).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from benchmarks.common import print_table, write_results
from experiments import RESULTS_DIR
from seedfast.config import load_config
from seedfast.runtime.setup import device_of, load_policy, load_run_tokenizer, load_tasks
from seedfast.train.draws import task_pool
from seedfast.train.evaluate import evaluate

ROOT = Path(__file__).resolve().parents[1]
EXTRA_EVAL_PER_LEVEL = 24
REPEATS = 4  # each game played 4 times, as the demo did when this probe was run
SETS = ("pool", "train, not pool", "held-out (demo)", "held-out (more)")


def game_sets(run: Path) -> dict[str, list]:
    cfg = load_config(run / "config.yaml", [])
    train = load_tasks(cfg, "train")
    pool = task_pool(train, cfg.rollout.task_pool, cfg.run.seed)
    pool_ids = {t.game_id for t in pool}
    demo_eval = load_tasks(cfg, "eval")[: cfg.trainer.eval_games or None]
    per_level = cfg.env.n_eval + EXTRA_EVAL_PER_LEVEL
    more_cfg = load_config(run / "config.yaml", [f"env.n_eval={per_level}"])
    demo_ids = {t.game_id for t in demo_eval}
    more = [t for t in load_tasks(more_cfg, "eval", generate=True) if t.game_id not in demo_ids]
    return {"pool": pool, "train, not pool": [t for t in train if t.game_id not in pool_ids],
            "held-out (demo)": demo_eval, "held-out (more)": more}


def probe(run_name: str) -> dict:
    run = ROOT / "runs" / run_name
    cfg = load_config(run / "config.yaml", ["log.progress=false", "log.tensorboard=false"])
    sets = game_sets(run)
    tokenizer = load_run_tokenizer(cfg, run / "sft")
    policies = {"sft": run / "sft", **{a: run / a / "hf" for a in cfg.demo.algorithms}}
    out: dict = {"seed": cfg.run.seed, "games": {k: len(v) for k, v in sets.items()}, "policies": {}}
    for name, path in policies.items():
        model = load_policy(cfg, path, device_of(cfg), trainable=False)
        out["policies"][name] = {}
        for set_name, tasks in sets.items():
            t = time.perf_counter()
            m = evaluate(cfg, model, tokenizer, tasks * REPEATS, seed=cfg.run.seed)
            out["policies"][name][set_name] = {
                "success": m["eval/success_rate"], "invalid_rate": m["eval/invalid_rate"],
                "episode_length": m["eval/episode_length"], "episodes": len(tasks) * REPEATS,
                "wall_s": round(time.perf_counter() - t, 1)}
            print(f"{run_name} {name:5s} {set_name:16s} success {m['eval/success_rate']:.3f} "
                  f"invalid {m['eval/invalid_rate']:.3f}", flush=True)
    return out


def main(run_names: list[str]) -> None:
    results = {r: probe(r) for r in run_names}
    rows = []
    for r, res in results.items():
        for policy, by_set in res["policies"].items():
            rows.append({"run": r, "policy": policy,
                         **{s: f"{by_set[s]['success']:.3f}" for s in SETS}})
    means = {}
    for policy in next(iter(results.values()))["policies"]:
        means[policy] = {s: sum(res["policies"][policy][s]["success"] for res in results.values()) / len(results)
                         for s in SETS}
        rows.append({"run": "mean", "policy": policy, **{s: f"{means[policy][s]:.3f}" for s in SETS}})
    print_table(rows, ["run", "policy", *SETS], title="success at rollout.eval_temperature, "
                f"each game played {REPEATS} times")
    write_results("generalization_probe", {
        "command": "python -m experiments.generalization_probe " + " ".join(run_names),
        "heldout_repeats": REPEATS, "extra_eval_per_level": EXTRA_EVAL_PER_LEVEL,
        "runs": results, "means": means}, packages=("torch", "textworld", "seedfast"), directory=RESULTS_DIR)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    main(sys.argv[1:])
