"""`seedfast sft CONFIG`: supervised fine-tuning (skill writing, + behaviour cloning), written in
sft/run.py (main), whose policy, device and dtype come from runtime/setup.py.

One code path for 1 and N processes: under torchrun with dist.strategy=fsdp (docs/scaling.md) this module starts
the process group and hands sft/run.py the distributed/ pieces as a `Sharding` (sft/ does not import dist): the model
sharded with FSDP2 over the ("dp_shard", "tp") mesh (runtime/setup.py policy_sharding, RL's builder too), the
data-parallel ranks' scalar reductions, dist's balanced split of each step's examples, and the gathered state rank 0
writes.
"""

from __future__ import annotations

from typing import Any

import torch

from seedfast.config import Config
from seedfast.runtime.setup import device_of, policy_sharding, start_processes
from seedfast.sft.loop import Sharding
from seedfast.sft.run import main as run_sft

__all__ = ["main", "sft_sharding"]


def sft_sharding(cfg: Config, device: torch.device) -> Sharding | None:
    """The `Sharding` of a started process group (None for a one-process run): the mesh and the FSDP2 sharding of
    runtime/setup.py policy_sharding, which refuses dist.tp > 1 for SFT (its loss has no vocabulary-parallel LM
    head)."""
    sharding = policy_sharding(cfg, device, "sft")
    if sharding is None:
        return None
    import torch.distributed as dist

    from seedfast.distributed.checkpoint import full_state_dict
    from seedfast.distributed.data import assign_groups

    dp, shard = sharding
    return Sharding(dp=dp, assign=assign_groups, shard=shard, full_state=full_state_dict,
                    is_main=dist.get_rank() == 0)


def main(cfg: Config, **flags: Any) -> int:
    """One process, or one rank of a sharded run (docs/scaling.md)."""
    start_processes(cfg, "sft")
    return run_sft(cfg, sharding=sft_sharding(cfg, device_of(cfg)), **flags)
