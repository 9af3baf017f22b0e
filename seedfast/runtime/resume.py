"""Resuming an RL run: which checkpoint (runtime/checkpoint.py resume_latest), what the config changed since it
was written (config/diff.py), and the changes that must reach the restored optimizer and schedule.

The learning rate: the schedule keeps its step count and takes the config's optim.lr as its base from the resumed
step on, so `--resume auto optim.lr=X` trains at X times the schedule's factor of that step (warm-up and cosine
continue where they were; a changed trainer.steps stretches the cosine). optim.weight_decay, optim.betas and
optim.eps are the config's too. With nothing changed this recomputes the restored values exactly (docs/reference.md,
'Checkpoints and resume').
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seedfast.config import Config
from seedfast.config.diff import config_changes, describe_changes, refuse_fixed_changes
from seedfast.runtime.checkpoint import _COMPLETE as COMPLETE
from seedfast.runtime.checkpoint import CONFIG_FILE, load_checkpoint, resume_latest
from seedfast.runtime.checkpoint_files import CheckpointError, remove_stale_temporaries


class ResumeWarning(UserWarning):
    """What a resumed run changed from its checkpoint's config, or that it could not tell."""


def resume_changes(cfg: Config, checkpoint: Path) -> dict[str, tuple[Any, Any]]:
    """The keys `cfg` changes from the config `checkpoint` was written with (one warning lists them all); a
    ConfigError when one of them cannot change (config/diff.py FIXED_ON_RESUME)."""
    saved = checkpoint / CONFIG_FILE
    if not saved.is_file():
        warnings.warn(f"{checkpoint} holds no {CONFIG_FILE} (written before checkpoints kept their config): the "
                      "resumed run's settings are not compared with it", ResumeWarning, stacklevel=2)
        return {}
    changes = config_changes(saved.read_text(), cfg, str(saved))
    refuse_fixed_changes(changes, str(checkpoint))
    if changes:
        warnings.warn(f"resuming {checkpoint} with {len(changes)} changed setting(s), in effect from step "
                      f"{checkpoint.name.removeprefix('step_')} on: {describe_changes(changes)}",
                      ResumeWarning, stacklevel=2)
    return changes


def apply_optim_config(cfg: Config, optimizer: torch.optim.Optimizer, scheduler: Any) -> None:
    """The config's optimizer settings on a restored optimizer and LambdaLR schedule (the module docstring)."""
    o = cfg.optim
    for group in optimizer.param_groups:
        group["initial_lr"] = o.lr
        group["betas"] = tuple(o.betas)
        group["eps"] = o.eps
        group["weight_decay"] = o.weight_decay  # RL's optimizer has one group (runtime/setup.py rl_optimizer)
    scheduler.base_lrs = [o.lr] * len(optimizer.param_groups)
    step = scheduler.last_epoch
    for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(step)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


@dataclass(frozen=True)
class Resumed:
    path: Path  # the checkpoint loaded
    state: dict[str, Any]  # its trainer state (`step`: the first step to run)
    changes: dict[str, tuple[Any, Any]]  # what the config changed since it was written

    @property
    def step(self) -> int:
        return int(self.state["step"])


def resume_run(cfg: Config, ckpt_dir: Path, trained: torch.nn.Module, optimizer: torch.optim.Optimizer,
               scheduler: Any) -> Resumed | None:
    """trainer.resume: `auto` = the newest checkpoint of `ckpt_dir` that verifies (a damaged one is named and passed
    over; none at all = a fresh start, None), a path = that checkpoint (verified; an error names what is wrong).
    The config is compared with the checkpoint's before its states are loaded; the optimizer then takes the
    config's settings (`apply_optim_config`). Without trainer.resume only the stale temporaries of a killed
    checkpoint write are removed."""
    from seedfast.distributed.checkpoint import rank_and_world, together

    changes: dict[str, tuple[Any, Any]] = {}
    rank = rank_and_world()[0]

    def compare(path: Path) -> None:  # rank 0 reads and says; a refusal stops every rank
        changes.update(together(lambda: resume_changes(cfg, path) if rank == 0 else {})[0])

    if not cfg.trainer.resume:
        together(lambda: remove_stale_temporaries(ckpt_dir) if rank == 0 else None)
        return None
    if cfg.trainer.resume == "auto":
        found = resume_latest(ckpt_dir, trained, optimizer, scheduler, before_load=compare)
        if found is None:
            return None
        path, state = found
    else:
        path = Path(cfg.trainer.resume)
        if not (path / COMPLETE).exists():  # before the config comparison, which would only add noise
            raise CheckpointError(f"checkpoint {path} is incomplete or missing (no {COMPLETE} marker)")
        compare(path)
        state = load_checkpoint(path, trained, optimizer, scheduler)
    apply_optim_config(cfg, optimizer, scheduler)
    return Resumed(path, state, changes)
