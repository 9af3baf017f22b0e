"""`seedfast envs make [textworld|alfworld] [CONFIG]`: the games of cfg.env, ready for a run.

TextWorld games are generated (or found in the cache of env.games_dir); ALFWorld games are not generated,
they come with ALFWorld's data: the command checks they are there and says how many a run will use.
"""

from __future__ import annotations

import os
from typing import Any

from seedfast.config import Config, ConfigError


def main(cfg: Config, **_flags: Any) -> int:
    e = cfg.env
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
