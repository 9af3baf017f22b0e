"""The device mesh of a run and the process group under it, from torchrun's environment and the `dist:` config.

    torchrun --nproc-per-node N -m seedfast train CONFIG dist.strategy=fsdp [dist.tp=T]

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; `init_process_group` starts torch's
process group from them (nccl on CUDA, gloo on CPU) and `build_mesh` lays the WORLD_SIZE ranks out as a 2-D mesh
("dp_shard", "tp"): tp consecutive ranks (one node's GPUs when tp <= 8) form a tensor-parallel group, and FSDP2
shards over the other dimension. See docs/scaling.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from seedfast.config import ConfigError
from seedfast.config.schema import DistConfig

MESH_DIMS = ("dp_shard", "tp")


@dataclass(frozen=True)
class MeshShape:
    """dp_shard x tp = world ranks."""

    dp_shard: int
    tp: int

    @property
    def world(self) -> int:
        return self.dp_shard * self.tp


def mesh_shape(cfg: DistConfig, world: int) -> MeshShape:
    """The mesh of `world` ranks the `dist:` section asks for; a ConfigError naming the key when it cannot be."""
    if cfg.strategy == "none":
        if world != 1:
            raise ConfigError(f"dist.strategy=none runs one process, but WORLD_SIZE={world}: set dist.strategy=fsdp "
                              "to train over the torchrun processes")
        if cfg.tp != 1 or cfg.dp_shard not in (None, 1):
            raise ConfigError(f"dist.strategy=none runs one process: dist.tp={cfg.tp} and "
                              f"dist.dp_shard={cfg.dp_shard} need dist.strategy=fsdp")
        return MeshShape(1, 1)
    if world % cfg.tp:
        raise ConfigError(f"dist.tp={cfg.tp} does not divide the {world} ranks (WORLD_SIZE)")
    dp = world // cfg.tp if cfg.dp_shard is None else cfg.dp_shard
    if dp * cfg.tp != world:
        raise ConfigError(f"dist.dp_shard={cfg.dp_shard} x dist.tp={cfg.tp} = {dp * cfg.tp}, but there are {world} "
                          "ranks (WORLD_SIZE); set dist.dp_shard=null to use them all")
    return MeshShape(dp, cfg.tp)


@dataclass(frozen=True)
class DistEnv:
    """This process's place among torchrun's: rank, world size, local rank (the GPU it owns)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_environ(cls) -> DistEnv:
        def get(name: str, default: int) -> int:
            value = os.environ.get(name)
            try:
                return default if value is None else int(value)
            except ValueError:
                raise ConfigError(f"environment variable {name}={value!r} is not an integer (set by torchrun)") \
                    from None

        env = cls(get("RANK", 0), get("WORLD_SIZE", 1), get("LOCAL_RANK", 0))
        if not 0 <= env.rank < env.world:
            raise ConfigError(f"RANK={env.rank} is outside WORLD_SIZE={env.world}")
        return env

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes config, metrics, TensorBoard, report and the HF export."""
        return self.rank == 0


def device_type(device: torch.device) -> str:
    return "cuda" if device.type == "cuda" else "cpu"


def init_process_group(device: torch.device, env: DistEnv | None = None) -> DistEnv:
    """Start torch.distributed from torchrun's environment (idempotent): nccl on CUDA (this rank's GPU is
    LOCAL_RANK), gloo on CPU. A single process (WORLD_SIZE unset or 1) starts nothing."""
    env = env or DistEnv.from_environ()
    if env.world == 1 or dist.is_initialized():
        return env
    if device.type == "cuda":
        torch.cuda.set_device(env.local_rank)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=env.rank, world_size=env.world)
    return env


def end_process_group(completed: bool) -> None:
    """Tear down the process group a command started (nothing when none was): after a barrier when the command
    completed, so no rank leaves while a peer still uses the group (a peer leaving first can abort a gloo rank:
    "terminate called without an active exception"); at once after a failure, whose peers may never reach one."""
    if not dist.is_initialized():
        return
    if completed:
        dist.barrier()
    dist.destroy_process_group()


def build_mesh(shape: MeshShape, device: torch.device) -> DeviceMesh:
    """The ("dp_shard", "tp") mesh over the started process group; tp ranks are consecutive (intra-node)."""
    if not dist.is_initialized():
        raise RuntimeError("build_mesh needs a started process group (init_process_group)")
    if dist.get_world_size() != shape.world:
        raise ConfigError(f"the mesh dp_shard={shape.dp_shard} x tp={shape.tp} needs {shape.world} ranks, "
                          f"the process group has {dist.get_world_size()}")
    return init_device_mesh(device_type(device), (shape.dp_shard, shape.tp), mesh_dim_names=MESH_DIMS)
