"""One ScienceWorld simulator (a JVM, seedfast/envs/scienceworld_env.py) on this machine: its start, a task's load and
reset, gold-sequence steps per second, and its memory after the start and at its peak, which bound the environment
slots (`slot_cap`: heap plus JVM_OVERHEAD_MB per slot).

    python -m benchmarks.scienceworld_jvm [--starts 3] [--tasks chemistry-mix-paint-secondary-color,boil]

`--starts` fresh JVMs are started and measured (seconds to the first answer, resident memory right after). Then one
JVM plays every task as a slot would, through ScienceWorldEnv: a load with the gold sequence and a reset, the gold
sequence replayed to its win (steps per second, each step with the valid actions the observation lists), then a load
of the task's next train variation and a reset (what the trainer pays to move a slot to another variation). The
JVM's peak resident memory (VmHWM) is read at the end. Writes results/scienceworld_jvm.json.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

from benchmarks.common import machine_info, print_table, write_results
from seedfast.envs.scienceworld_env import (
    HEAP_MB,
    JVM_OPTIONS,
    JVM_OVERHEAD_MB,
    ScienceWorldEnv,
    Simulator,
    Variation,
    close_idle,
    java_path,
    slot_cap,
    variations,
)

TASKS = ("chemistry-mix-paint-secondary-color", "lifespan-longest-lived", "find-non-living-thing", "boil")


def starts(n: int, heap_mb: int) -> list[dict]:
    rows = []
    for i in range(n):
        sim = Simulator(heap_mb)
        try:
            rows.append({"start": i, "start_s": round(sim.start_s, 3), "rss_mb": round(sim.rss_mb(), 1)})
        finally:
            sim.kill()
    return rows


def play(tasks: list[str], simplifications: str, heap_mb: int) -> tuple[list[dict], dict]:
    rows, sim = [], None
    for task in tasks:
        first, second = variations(task, "train")[:2]
        env = ScienceWorldEnv(Variation(task, first, simplifications), gold=True, heap_mb=heap_mb, step_limit=1000)
        t = time.perf_counter()
        env.reset()
        load_gold_reset_s = time.perf_counter() - t
        sim = env.simulator
        env.reset()  # loaded: a reset alone
        steps, won, valid_sizes, text_chars = 0, False, [], []
        t = time.perf_counter()
        for action in env.walkthrough or []:
            obs, _, done, info = env.step(action)
            steps += 1
            valid_sizes.append(len(obs.admissible_actions))
            text_chars.append(len(obs.text))
            if done:
                won = info["won"]
                break
        step_s = time.perf_counter() - t
        env.close()  # the JVM goes to the next environment, as in a worker
        other = ScienceWorldEnv(Variation(task, second, simplifications), heap_mb=heap_mb)
        t = time.perf_counter()
        other.reset()
        load_reset_s = time.perf_counter() - t
        assert other.simulator is sim, "the slot's JVM was not reused"
        other.close()
        rows.append({"task": task, "gold_steps": steps, "won": won, "steps_per_s": round(steps / step_s, 2),
                     "load_gold_reset_s": round(load_gold_reset_s, 3), "load_reset_s": round(load_reset_s, 3),
                     "valid_actions_mean": round(statistics.mean(valid_sizes), 1),
                     "valid_actions_max": max(valid_sizes), "text_chars_max": max(text_chars),
                     "rss_mb": round(sim.rss_mb(), 1)})
    peak = {"rss_mb_end": round(sim.rss_mb(), 1), "peak_rss_mb": round(sim.peak_rss_mb(), 1)}
    close_idle()
    return rows, peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--starts", type=int, default=3)
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--simplifications", default="easy")
    p.add_argument("--heap-mb", type=int, default=HEAP_MB)
    args = p.parse_args()
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    start_rows = starts(args.starts, args.heap_mb)
    print_table(start_rows, ["start", "start_s", "rss_mb"], title=f"JVM start (-Xmx{args.heap_mb}m)")
    rows, peak = play(tasks, args.simplifications, args.heap_mb)
    print_table(rows, ["task", "gold_steps", "won", "steps_per_s", "load_gold_reset_s", "load_reset_s",
                       "valid_actions_mean", "valid_actions_max", "text_chars_max", "rss_mb"],
                title=f"one slot's JVM, simplifications {args.simplifications!r}")
    budget = args.heap_mb + JVM_OVERHEAD_MB
    summary = {
        "start_s_median": statistics.median(r["start_s"] for r in start_rows),
        "rss_after_start_mb_median": statistics.median(r["rss_mb"] for r in start_rows),
        **peak,
        "steps_per_s_median": statistics.median(r["steps_per_s"] for r in rows),
        "load_reset_s_median": statistics.median(r["load_reset_s"] for r in rows),
        "slot_budget_mb": budget,
        "slot_cap_here": slot_cap(args.heap_mb),
        "mem_total_gib": machine_info().get("mem_total_gib"),
    }
    print(f"peak RSS of one slot's JVM {peak['peak_rss_mb']} MiB (budget per slot {budget} MiB = heap {args.heap_mb} "
          f"+ overhead {JVM_OVERHEAD_MB}); slots this machine holds: {summary['slot_cap_here']}")
    if peak["peak_rss_mb"] > budget:
        print(f"warning: the peak RSS is above the slot budget: raise JVM_OVERHEAD_MB to "
              f"{int(peak['peak_rss_mb'] - args.heap_mb) + 1} or more")
    write_results("scienceworld_jvm", {
        "java": subprocess.run([java_path(), "-version"], capture_output=True, text=True).stderr.splitlines()[0],
        "config": {"heap_mb": args.heap_mb, "jvm_options": list(JVM_OPTIONS), "simplifications": args.simplifications,
                   "tasks": tasks, "starts": args.starts},
        "starts": start_rows, "tasks": rows, "summary": summary,
    }, packages=("scienceworld", "py4j", "seedfast"))


if __name__ == "__main__":
    main()
