"""Where rollouts run (docs/architecture.md, 'Asynchronous rollouts'): on the trainer's device, or, for asynchronous RL,
on GPUs of their own (`rollout.devices`), as verl's fully-async trainer and NeMo-RL's non-colocated generation do.

    check_placement(cfg, trainer_device, local_world)   # one ConfigError naming the key, before anything is built
    with producer_environment(cfg):                      # the producer sees only its GPUs, and is no rank ...
        process.start()
    device = producer_device(cfg, trainer_device)        # ... and runs on the first of them (cuda:0 of its view)

The trainer's ranks keep the GPUs torchrun gives them (LOCAL_RANK 0..n-1; one process: GPU 0). The producer is
started with CUDA_VISIBLE_DEVICES set to `rollout.devices` and without torchrun's rank variables, so a vLLM engine's
tensor-parallel workers take exactly those GPUs, and the weight group between trainer rank 0 and the producer is
NCCL (distributed/weight_channel.py chooses the backend by the device).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from seedfast.config import Config, ConfigError

VISIBLE = "CUDA_VISIBLE_DEVICES"


def trainer_gpus(local_world: int) -> list[int]:
    """The GPUs this node's trainer ranks run on: LOCAL_RANK 0..local_world-1 (runtime/setup.device_of)."""
    return list(range(local_world))


def check_placement(cfg: Config, trainer_device: torch.device, local_world: int | None = None,
                    gpu_count: int | None = None, *, on_node: bool = True) -> None:
    """Refuse a placement the run cannot keep, naming the key: rollout devices for a synchronous run, a rollout
    producer sharing the trainer's GPU, rollout GPUs that overlap the trainer's or that this node lacks, and a count
    that does not match the engine. `local_world`: the trainer's ranks on this node (default: torchrun's
    LOCAL_WORLD_SIZE, else 1); `gpu_count`: the GPUs the trainer sees (default: torch's count). `on_node=False`
    (the memory plan, which knows no node): the placement's own consistency only, not the node's GPUs."""
    r = cfg.rollout
    if local_world is None:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    devices = r.devices
    if devices is None:
        if r.max_staleness > 0 and trainer_device.type != "cpu":
            raise ConfigError(
                f"rollout.max_staleness={r.max_staleness} on {trainer_device}: the rollout producer would share the "
                "trainer's GPU; give it GPUs of its own with rollout.devices (e.g. rollout.devices=1), or set "
                "trainer.device=cpu or rollout.max_staleness=0")
        return
    if r.max_staleness == 0:
        raise ConfigError(f"rollout.devices={devices}: GPUs of their own are for the rollout producer of "
                          "asynchronous RL; set rollout.max_staleness >= 1, or rollout.devices=null for the "
                          "synchronous loop (its engine runs on the trainer's device)")
    if not devices or len(set(devices)) != len(devices) or min(devices) < 0:
        raise ConfigError(f"rollout.devices={devices}: distinct GPU indices >= 0 expected")
    if trainer_device.type != "cuda":
        raise ConfigError(f"rollout.devices={devices} with the trainer on {trainer_device}: the weights go to the "
                          "producer over an NCCL group, GPU to GPU; set trainer.device=cuda (or rollout.devices=null "
                          "to roll out on the CPU beside a CPU trainer)")
    want = r.tensor_parallel if r.engine == "vllm" else 1
    if len(devices) != want:
        what = f"rollout.tensor_parallel={r.tensor_parallel} (vLLM)" if r.engine == "vllm" else "the own engine's one"
        raise ConfigError(f"rollout.devices={devices}: {len(devices)} GPU(s) for {what}; give as many as it uses")
    if not on_node:
        return
    shared = sorted(set(devices) & set(trainer_gpus(local_world)))
    if shared:
        raise ConfigError(f"rollout.devices={devices}: GPU(s) {shared} are the trainer's (its {local_world} rank(s) "
                          f"on this node run on GPUs 0-{local_world - 1}); give the producer others")
    count = torch.cuda.device_count() if gpu_count is None else gpu_count
    missing = [d for d in devices if d >= count]
    if missing:
        raise ConfigError(f"rollout.devices={devices}: this node has {count} GPU(s), no GPU {missing}")


def producer_device(cfg: Config, trainer_device: torch.device) -> torch.device:
    """The producer's device, in its own view: the first of its visible GPUs, or the trainer's device."""
    return torch.device("cuda", 0) if cfg.rollout.devices is not None else trainer_device


# torchrun's variables of a rank: the producer is no rank of the trainer's group (its weight group has a store of
# its own), so nothing it runs (vLLM's own distributed set-up included) may take it for one
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                   "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")


def producer_variables(cfg: Config, environ: dict[str, str]) -> dict[str, str | None]:
    """What the producer's environment changes from `environ` (None: removed): torchrun's rank variables gone, and
    CUDA_VISIBLE_DEVICES set to rollout.devices. The indices are torch.cuda's in the trainer, so a trainer that
    itself sees a subset of the GPUs maps them through its own CUDA_VISIBLE_DEVICES first."""
    changes: dict[str, str | None] = {k: None for k in environ
                                      if k in _RANK_VARIABLES or k.startswith("TORCHELASTIC_")}
    devices = cfg.rollout.devices
    if devices is not None:
        seen = environ.get(VISIBLE)
        if seen:
            node = [x.strip() for x in seen.split(",") if x.strip()]
            devices = [node[d] for d in devices]
        changes[VISIBLE] = ",".join(str(d) for d in devices)
    return changes


@contextlib.contextmanager
def producer_environment(cfg: Config) -> Iterator[None]:
    """`producer_variables` applied while the producer process starts (a spawned child copies the environment at its
    start), and undone after."""
    changes = producer_variables(cfg, dict(os.environ))
    before = {k: os.environ.get(k) for k in changes}
    _apply(changes)
    try:
        yield
    finally:
        _apply(before)


def _apply(values: dict[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
