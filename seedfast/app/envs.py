"""`seedfast envs make [textworld|alfworld|scienceworld] [CONFIG]`: the games of cfg.env, ready for a run;
`seedfast envs list scienceworld [CONFIG]`: ScienceWorld's tasks and the sizes of their splits.

TextWorld games are generated (or found in the cache of env.games_dir); ALFWorld games are not generated,
they come with ALFWorld's data: the command checks they are there and says how many a run will use. ScienceWorld's
variations come with its simulator: `make` starts one (a JVM) and says how many of each split a run will use.
"""

from __future__ import annotations

import os
from typing import Any

from seedfast.config import Config, ConfigError


def main(cfg: Config, action: str = "make", **_flags: Any) -> int:
    e = cfg.env
    if e.kind == "scienceworld":
        return scienceworld(cfg, action)
    if action != "make":
        raise ConfigError(f"`seedfast envs {action}` lists ScienceWorld's tasks (env.kind=scienceworld); "
                          f"env.kind={e.kind} has `seedfast envs make`")
    if e.kind == "alfworld":
        from seedfast.envs.alfworld import list_alfworld_games

        try:
            train = list_alfworld_games("train", e.games_dir, e.game_type)[: e.n_train]
            held_out = list_alfworld_games("eval_out_of_distribution", e.games_dir, e.game_type)[: e.n_eval]
        except FileNotFoundError as err:
            raise ConfigError(f"env.games_dir: {err}") from err
        print(f"ALFWorld games are read from its data, not generated: {len(train)} train, {len(held_out)} eval "
              f"(out of distribution) of task type {e.game_type} in {e.games_dir}")
        return 0
    from seedfast.envs.textworld_games import make_games

    records = make_games(e.games_dir, e.game_type, e.levels, e.n_train, e.n_eval, seed=e.games_seed,
                         workers=e.workers or os.cpu_count() or 1)
    n_train = sum(r.split == "train" for r in records)
    print(f"{len(records)} {e.game_type} games (levels {e.levels}): {n_train} train, {len(records) - n_train} eval "
          f"in {e.games_dir}")
    return 0


def scienceworld(cfg: Config, action: str) -> int:
    """list: the 30 tasks (id, topic, train/dev/test variations) and what this config plays; make: that, after a
    simulator has started and loaded the config's first task (the Java runtime and the jar work here)."""
    import time

    from seedfast.envs.scienceworld_env import ScienceWorldEnv, Variation, split_table, task_table
    from seedfast.runtime.setup import scienceworld_tasks

    sw = cfg.env.scienceworld
    splits = split_table()
    print(f"ScienceWorld: {len(task_table())} tasks; variations per split (train: RL, SFT and collection; dev: "
          "the run's evaluation, selection; test: `seedfast eval --split test` only)")
    print(f"{'id':<5} {'task':<50} {'topic':<14} {'train':>5} {'dev':>5} {'test':>5}")
    for t in task_table():
        n = {split: len(v) for split, v in splits[t["task_name"]].items()}
        mark = "*" if t["task_name"] in sw.tasks else " "
        print(f"{t['task_id']:<5}{mark}{t['task_name']:<50} {t['topic']:<14} {n['train']:>5} {n['dev']:>5} "
              f"{n['test']:>5}")
    counts = {split: len(scienceworld_tasks(cfg, split, walkthroughs=False)) for split in ("train", "eval", "test")}
    print(f"* this config (env.scienceworld.tasks, simplifications {sw.simplifications or 'none'!r}): "
          f"{counts['train']} train, {counts['eval']} dev (eval), {counts['test']} test variations")
    if action == "make":
        started = time.monotonic()
        env = ScienceWorldEnv(Variation(sw.tasks[0], splits[sw.tasks[0]]["train"][0], sw.simplifications),
                              heap_mb=sw.heap_mb, call_timeout_s=sw.call_timeout_s, max_chars=sw.max_text_chars)
        try:
            env.reset()
            print(f"the simulator started and loaded {env.game_id} in {time.monotonic() - started:.1f}s "
                  f"(JVM pid {env.pid}, -Xmx{sw.heap_mb}m)")
        finally:
            env.close()
    return 0
