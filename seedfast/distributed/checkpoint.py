"""Distributed checkpoints of a sharded policy with torch.distributed.checkpoint (DCP), and its HF export.

A sharded checkpoint folder holds `dcp/` (the model and optimizer states, written by every rank: its own shards,
with DCP's metadata, keyed by parameter name) beside what runtime/checkpoint.py writes for every run (scheduler,
RNG, trainer state). DCP reshards on load: a checkpoint written on N ranks loads on M ranks, or into one unsharded
model in a process without a process group (docs/scaling.md, 'Checkpoints').

A LoRA policy's `dcp/` holds its trainable parameters (the adapters) and their optimizer states only: the frozen base
is left out (StateDictOptions(ignore_frozen_params=True)) and named and hashed beside it instead (lora_base.json,
runtime/checkpoint.py), as in a one-process LoRA checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

from seedfast.model.lora import has_lora, lora_spec_of, merge_state

DCP_DIR = "dcp"


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether any parameter of `model` is a DTensor (FSDP2 and/or tensor parallel)."""
    return any(isinstance(p, DTensor) for p in model.parameters())


def rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _options(model: torch.nn.Module) -> StateDictOptions:
    """A LoRA model's states leave its frozen base out (module docstring); a full model's hold every parameter."""
    return StateDictOptions(ignore_frozen_params=has_lora(model))


def save_states(folder: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Every rank writes its shards of the model (and optimizer) states to `folder`/dcp (a collective); of a LoRA
    model, the adapters' (module docstring)."""
    model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else [], options=_options(model))
    state: dict[str, Any] = {"model": model_sd}
    if optimizer is not None:
        state["optimizer"] = optim_sd
    dcp.save(state, checkpoint_id=str(Path(folder) / DCP_DIR))


def has_states(folder: str | Path) -> bool:
    return (Path(folder) / DCP_DIR / ".metadata").is_file()


def load_states(folder: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Load `folder`/dcp into `model` (and `optimizer`), whatever the ranks that wrote it and whatever this
    model's sharding (also none, in a process without a process group)."""
    options = _options(model)
    model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else [], options=options)
    state: dict[str, Any] = {"model": model_sd}
    if optimizer is not None:
        state["optimizer"] = optim_sd
    dcp.load(state, checkpoint_id=str(Path(folder) / DCP_DIR))  # every key of `state` must be in the checkpoint
    # set_state_dict hands model.load_state_dict its `strict`: with the frozen base left out, a strict load would
    # call the base missing. Not strict, then, and what it reports is checked here: only frozen parameters missing
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad} if options.ignore_frozen_params else set()
    result = set_state_dict(model, optimizer if optimizer is not None else [], model_state_dict=state["model"],
                            optim_state_dict=state.get("optimizer", {}),
                            options=StateDictOptions(ignore_frozen_params=options.ignore_frozen_params,
                                                     strict=not options.ignore_frozen_params))
    if result is not None:
        missing = sorted(set(result.missing_keys) - frozen)
        if missing or result.unexpected_keys:
            raise ValueError(f"the model states of {Path(folder) / DCP_DIR} do not fit the model: missing "
                             f"{missing[:4]}, unexpected {sorted(result.unexpected_keys)[:4]}")


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded model state on the CPU of rank 0 (empty on the other ranks; a collective)."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def export_hf(model: torch.nn.Module, folder: str | Path, dtype: torch.dtype | None = None) -> Path | None:
    """The sharded policy as one HF folder (config.json + safetensors) that transformers loads, its weights in
    `dtype` (default: as trained): every rank takes part in gathering the weights, rank 0 alone writes. A LoRA
    policy is written merged, W + s·B·A summed in fp32 from the gathered base and adapters (model/lora.py
    merge_state): the folder a one-process run writes. Returns the folder on rank 0, None elsewhere."""
    from seedfast.model import save_hf

    state = full_state_dict(model)
    rank, _ = rank_and_world()
    if rank == 0:
        spec = lora_spec_of(model)
        if spec is not None:
            state = merge_state(state, spec, dtype)
        elif dtype is not None:
            state = {k: v.to(dtype) for k, v in state.items()}
    out = save_hf(model, folder, state_dict=state) if rank == 0 else None
    barrier()
    return out


class _GatheredAdapters(torch.nn.Module):
    """What model/peft_io.py save_peft_adapter reads of a model, its LoRASpec and adapter tensors, holding the whole
    tensors gathered from a sharded one."""

    def __init__(self, spec: Any, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.lora_spec = spec
        self._tensors = tensors

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # noqa: ARG002 - nn.Module's
        return dict(self._tensors)


def export_peft_adapter(model: torch.nn.Module, folder: str | Path, base_model: str | None = None) -> Path | None:
    """A sharded LoRA policy's adapters as a PEFT adapter folder (model/peft_io.py): every rank takes part in
    gathering the whole adapter tensors (the frozen base is not gathered), rank 0 alone writes. Returns the folder
    on rank 0, None elsewhere."""
    from seedfast.model.peft_io import save_peft_adapter

    spec = lora_spec_of(model)
    if spec is None:
        raise ValueError("export_peft_adapter: the model has no LoRA adapters")
    tensors = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                                   ignore_frozen_params=True))
    rank, _ = rank_and_world()
    out = save_peft_adapter(_GatheredAdapters(spec, tensors), folder, base_model=base_model) if rank == 0 else None
    barrier()
    return out


def together(fn: Callable[[], Any] | None) -> list[Any]:
    """Run `fn` on this rank (None: nothing to do here) and return every rank's result, in rank order; when it
    failed on any rank, raise that error on every rank (the first rank's), so no rank waits at a barrier for one
    that has already given up. Without a process group: [fn()]."""
    result, error = None, None
    try:
        result = fn() if fn is not None else None
    except Exception as err:  # noqa: BLE001 - shared with the other ranks, then raised
        error = err
    if not (dist.is_available() and dist.is_initialized()):
        if error is not None:
            raise error
        return [result]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (result, None if error is None else (type(error), str(error), error.args)))
    for rank, (_, failed) in enumerate(gathered):
        if failed is not None:
            if error is not None and rank == dist.get_rank():
                raise error
            kind, message, args = failed
            try:
                again = kind(*args)
            except TypeError:
                again = RuntimeError(f"rank {rank}: {kind.__name__}: {message}")
            raise again
    return [r for r, _ in gathered]
