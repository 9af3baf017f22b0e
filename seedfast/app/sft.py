"""`seedfast sft CONFIG`: supervised fine-tuning (skill writing, + behaviour cloning), written in
sft/run.py (main), whose policy, device and dtype come from runtime/setup.py.

One code path for 1 and N processes: under torchrun with dist.strategy=fsdp (docs/scaling.md) this module starts
the process group and hands sft/run.py the distributed/ pieces as a `Sharding` (sft/ does not import dist): the model
sharded with FSDP2 over the ("dp_shard", "tp") mesh, the data-parallel ranks' scalar reductions, dist's
balanced split of each step's examples, and the gathered state rank 0 writes.
"""

from __future__ import annotations

from typing import Any

import torch

from seedfast.config import Config, ConfigError
from seedfast.runtime.setup import device_of, fsdp_precision, start_processes
from seedfast.sft.loop import Sharding
from seedfast.sft.run import main as run_sft

__all__ = ["main", "sft_sharding"]


def sft_sharding(cfg: Config, device: torch.device) -> Sharding:
    """The `Sharding` of a started process group: the mesh shard_policy (runtime/setup.py) builds, less its
    rollout check (SFT rolls nothing out). FSDP2 only: the SFT loss has no vocabulary-parallel head."""
    import torch.distributed as dist

    from seedfast.distributed.checkpoint import full_state_dict
    from seedfast.distributed.data import DataParallel, assign_groups
    from seedfast.distributed.mesh import build_mesh, mesh_shape
    from seedfast.distributed.parallelize import parallelize_decoder

    shape = mesh_shape(cfg.dist, dist.get_world_size())
    if shape.tp > 1:
        raise ConfigError(f"dist.tp={shape.tp}: `seedfast sft` shards with FSDP2 only (its loss has no "
                          "vocabulary-parallel LM head); set dist.tp=1")
    mesh = build_mesh(shape, device)

    def shard(model: torch.nn.Module) -> torch.nn.Module:
        return parallelize_decoder(model, mesh, activation_checkpointing=cfg.dist.activation_checkpointing,
                                   **fsdp_precision(cfg))

    return Sharding(dp=DataParallel.from_mesh(mesh), assign=assign_groups, shard=shard,
                    full_state=full_state_dict, is_main=dist.get_rank() == 0)


def main(cfg: Config, **flags: Any) -> int:
    """One process, or one rank of a sharded run (docs/scaling.md)."""
    import torch.distributed as dist

    start_processes(cfg, "sft")
    sharding = sft_sharding(cfg, device_of(cfg)) if dist.is_initialized() else None
    return run_sft(cfg, sharding=sharding, **flags)
