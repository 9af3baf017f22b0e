"""Resumable checkpoints, written atomically.

A checkpoint is a folder `ckpt/step_<n>/` holding the policy (safetensors), the optimizer and scheduler states,
every RNG state and the trainer's own state (step, task sampler). It is written under a temporary name and renamed
into place only when complete, so a run killed at any moment leaves either the previous checkpoint or the new one,
never half of one. `latest_checkpoint` ignores anything that is not complete.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

_COMPLETE = "COMPLETE"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state(generators: dict[str, torch.Generator] | None = None) -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "generators": {name: g.get_state() for name, g in (generators or {}).items()},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator] | None = None) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    for name, g in (generators or {}).items():
        if name not in state["generators"]:
            raise ValueError(f"checkpoint has no RNG state for generator {name!r}")
        g.set_state(state["generators"][name])


def save_checkpoint(
    ckpt_dir: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    trainer_state: dict[str, Any],
    generators: dict[str, torch.Generator] | None = None,
    keep: int | None = None,
) -> Path:
    """Write `ckpt_dir/step_<step>` atomically and return its path; keep only the newest `keep` checkpoints.
    A sharded model (FSDP2 / tensor parallel) is written by every rank with DCP (`_save_sharded`)."""
    from seedfast.distributed.checkpoint import is_sharded

    if is_sharded(model):
        return _save_sharded(Path(ckpt_dir), step, model, optimizer, scheduler, trainer_state, generators, keep)
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step_{step}"
    tmp = ckpt_dir / f".step_{step}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    tensors = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(tensors, tmp / "model.safetensors")
    torch.save(
        {
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng": rng_state(generators),
        },
        tmp / "state.pt",
    )
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **trainer_state}, indent=1))
    (tmp / _COMPLETE).write_text("ok\n")
    _publish(tmp, final, keep)
    return final


def _publish(tmp: Path, final: Path, keep: int | None) -> None:
    """fsync every file and folder of `tmp`, rename it to `final` (a re-run of the same step, after a resume,
    replaces it whole) and keep only the newest `keep` checkpoints beside it."""
    for f in sorted(tmp.rglob("*")):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    for d in sorted((p for p in tmp.rglob("*") if p.is_dir()), reverse=True):
        _fsync_dir(d)
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    if keep is not None and keep > 0:
        for old in list_checkpoints(final.parent)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def _save_sharded(ckpt_dir: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                  scheduler: Any | None, trainer_state: dict[str, Any],
                  generators: dict[str, torch.Generator] | None, keep: int | None) -> Path:
    """Every rank writes its model and optimizer shards (DCP) and its RNG state into the temporary folder; rank 0
    then writes the scheduler and trainer state, marks it complete and renames it into place, as above. Ranks
    wait for each other before and after, so no rank reads a half-written checkpoint."""
    from seedfast.distributed.checkpoint import barrier, rank_and_world, save_states

    rank, world = rank_and_world()
    final = ckpt_dir / f"step_{step}"
    tmp = ckpt_dir / f".step_{step}.tmp"
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    barrier()
    save_states(tmp, model, optimizer)
    torch.save(rng_state(generators), tmp / f"rng_rank{rank}.pt")
    barrier()
    if rank == 0:
        torch.save({"scheduler": scheduler.state_dict() if scheduler is not None else None, "world": world},
                   tmp / "state.pt")
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **trainer_state}, indent=1))
        (tmp / _COMPLETE).write_text("ok\n")
        _publish(tmp, final, keep)
    barrier()
    return final


def list_checkpoints(ckpt_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = []
    for p in ckpt_dir.iterdir():
        if p.is_dir() and p.name.startswith("step_") and (p / _COMPLETE).exists():
            try:
                found.append((int(p.name[len("step_"):]), p))
            except ValueError:
                continue
    return [p for _, p in sorted(found)]


def latest_checkpoint(ckpt_dir: str | Path) -> Path | None:
    ckpts = list_checkpoints(ckpt_dir)
    return ckpts[-1] if ckpts else None


def load_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    generators: dict[str, torch.Generator] | None = None,
) -> dict[str, Any]:
    """Restore everything saved by `save_checkpoint`; returns the trainer state (with `step`)."""
    path = Path(path)
    if not (path / _COMPLETE).exists():
        raise ValueError(f"checkpoint {path} is incomplete or missing (no {_COMPLETE} marker)")
    from seedfast.distributed.checkpoint import has_states, is_sharded

    if has_states(path):
        return _load_sharded(path, model, optimizer, scheduler, generators)
    if is_sharded(model):
        raise ValueError(f"checkpoint {path} was written by one process (model.safetensors); resume it with "
                         "dist.strategy=none, or start the sharded run from an HF export (trainer.init_from)")
    tensors = load_file(path / "model.safetensors")
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not fit the model: missing {missing}, unexpected {unexpected}")
    state = torch.load(path / "state.pt", weights_only=False)
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"], generators)
    return json.loads((path / "trainer_state.json").read_text())


def _load_sharded(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler: Any | None,
                  generators: dict[str, torch.Generator] | None) -> dict[str, Any]:
    """A checkpoint written by `_save_sharded` on any number of ranks, into this model however it is sharded (DCP
    reshards). The RNG state is this rank's when the checkpoint has one (same rank count), else rank 0's."""
    from seedfast.distributed.checkpoint import load_states, rank_and_world

    load_states(path, model, optimizer)
    state = torch.load(path / "state.pt", weights_only=False)
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    rank, world = rank_and_world()
    rng_file = path / f"rng_rank{rank if world == state['world'] else 0}.pt"
    set_rng_state(torch.load(rng_file, weights_only=False), generators)
    return json.loads((path / "trainer_state.json").read_text())
