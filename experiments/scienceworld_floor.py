"""The floor of the ScienceWorld CPU recipe: a uniformly random admissible policy on its held-out test variations.

    python -m experiments.scienceworld_floor [--config configs/smollm2-135m_scienceworld.yaml] [--seeds 0 1 2]

Each seed plays every test variation of the config once (`seedfast eval --split test`'s tasks: env.n_eval per task
type), up to env.max_steps steps, each action drawn uniformly from the observation's admissible actions (the
train/evaluate.py floor, `random_policy_success`, with the partial score kept too; a random stream per episode). Writes
results/scienceworld_floor.json: per seed and per task type the success rate and the mean final score (0-100; -100
once the task was made impossible), and how the episodes ended.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import Counter

from benchmarks.common import write_results
from experiments import RESULTS_DIR
from seedfast.config import load_config
from seedfast.runtime.setup import make_env_slots
from seedfast.train.evaluate import evaluation_tasks


def play(cfg, tasks, seed: int, envs) -> list[dict]:
    plays = []
    for task in tasks:
        # one stream per episode: ScienceWorld's valid-action lists are not always the same from one JVM to the next
        # (two runs of this script once differed in one episode's), and a shared stream would carry that difference
        # into every later episode
        rng = random.Random(f"{seed}/{task.game_id}")
        obs = envs.reset({0: task.spec})[0]
        info: dict = {"won": False, "score": 0}
        steps, focus = 0, 0
        while steps < cfg.env.max_steps:
            steps += 1
            action = rng.choice(obs.admissible_actions)
            focus += action.startswith("focus on")
            obs, _, done, info = envs.step({0: action})[0]
            if done:
                break
        end = "won" if info.get("won") else "lost" if info.get("lost") else "error" if "error" in info else "steps"
        plays.append({"task": task.spec.task, "variation": task.spec.variation, "won": bool(info.get("won")),
                      "score": info.get("score", 0), "steps": steps, "end": end, "focus_actions": focus})
    return plays


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/smollm2-135m_scienceworld.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = p.parse_args()
    cfg = load_config(args.config, ["env.isolation=inline"])
    tasks = evaluation_tasks(cfg, "test")
    envs = make_env_slots(cfg, 1)
    t = time.perf_counter()
    try:
        runs = {str(seed): play(cfg, tasks, seed, envs) for seed in args.seeds}
    finally:
        envs.close()
    rows = []
    for seed, plays in runs.items():
        for task in cfg.env.scienceworld.tasks:
            mine = [x for x in plays if x["task"] == task]
            rows.append({"seed": int(seed), "task": task, "episodes": len(mine),
                         "success": sum(x["won"] for x in mine) / len(mine),
                         "mean_score": statistics.mean(x["score"] for x in mine),
                         "ends": dict(Counter(x["end"] for x in mine))})
    everything = [x for plays in runs.values() for x in plays]
    summary = {"episodes": len(everything), "wins": sum(x["won"] for x in everything),
               "success": sum(x["won"] for x in everything) / len(everything),
               "mean_score": statistics.mean(x["score"] for x in everything),
               "ends": dict(Counter(x["end"] for x in everything)), "seconds": round(time.perf_counter() - t, 1)}
    for row in rows:
        print(f"seed {row['seed']} {row['task']:<28} {row['episodes']:>3} episodes: success {row['success']:.2f}, "
              f"mean score {row['mean_score']:.1f}, ends {row['ends']}")
    print(f"all: {summary}")
    write_results("scienceworld_floor", {
        "config": args.config, "split": "test", "max_steps": cfg.env.max_steps,
        "tasks": cfg.env.scienceworld.tasks, "simplifications": cfg.env.scienceworld.simplifications,
        "seeds": args.seeds, "rows": rows, "summary": summary, "plays": runs,
    }, packages=("scienceworld", "seedfast"), directory=RESULTS_DIR)


if __name__ == "__main__":
    main()
