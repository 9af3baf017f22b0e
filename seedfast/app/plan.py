"""`seedfast plan CONFIG [--world N] [dist.tp=T]`: per-GPU memory of the run on N GPUs, printed and written as
JSON, from the real model on the meta device sharded over a fake process group (seedfast/distributed/plan.py,
docs/scaling.md); with rollout.devices, the rollout producer's GPUs too."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from seedfast.config import Config, ConfigError
from seedfast.distributed.plan import memory_plan
from seedfast.runtime.paths import RunPaths
from seedfast.runtime.placement import check_placement


def main(cfg: Config, world: int | None = None, json_path: str | None = None) -> int:
    if world is None:
        if cfg.dist.dp_shard is None:
            raise ConfigError("seedfast plan: give --world N (or set dist.dp_shard, the world being dp_shard x tp)")
        world = cfg.dist.dp_shard * cfg.dist.tp
    # the placement's own consistency (runtime/placement.py); the node's GPUs are checked by the run
    check_placement(cfg, torch.device("cuda"), on_node=False)
    plan = memory_plan(cfg, world)
    print(plan.table())
    out = Path(json_path) if json_path else RunPaths.of(cfg).plan(plan.world, plan.tp)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(plan.to_json(), indent=1) + "\n")
    print(f"wrote {out}")
    return 0
