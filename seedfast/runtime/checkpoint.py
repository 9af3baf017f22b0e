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
    """Write `ckpt_dir/step_<step>` atomically and return its path; keep only the newest `keep` checkpoints."""
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
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    _fsync_dir(tmp)
    if final.exists():  # a re-run of the same step (after a resume) replaces it whole
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(ckpt_dir)
    if keep is not None and keep > 0:
        for old in list_checkpoints(ckpt_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
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
