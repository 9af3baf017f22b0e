"""Resumable checkpoints, written atomically.

A checkpoint is a folder `ckpt/step_<n>/` holding the policy (safetensors), the optimizer and scheduler states,
every RNG state and the trainer's own state (step, task sampler). It is written under a temporary name and renamed
into place only when complete, so a run killed at any moment leaves either the previous checkpoint or the new one,
never half of one. `latest_checkpoint` ignores anything that is not complete.

Every checkpoint also lists its files with their sizes and sha256 in `manifest.json`, written before COMPLETE
(runtime/checkpoint_files.py). `resume_latest` checks the newest checkpoint against it before loading, and a damaged
one is named in a warning and passed over for the next newest (docs/reference.md, 'Checkpoints and resume'). A write
checks the free space first, and any failure (a full disk, a signal) removes the partial folder: the previous
checkpoint stays the newest.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from seedfast.model.lora import adapter_state_dict, has_lora, load_adapter_state
from seedfast.runtime.adapters import BASE_FILE, base_record
from seedfast.runtime.checkpoint_files import (
    CheckpointError,
    CheckpointWriter,
    check_free_space,
    remove_stale_temporaries,
    verify_files,
)

_COMPLETE = "COMPLETE"
_SLACK_BYTES = 1 << 20  # the JSON and RNG files beside the tensors


class CheckpointWarning(UserWarning):
    """A checkpoint passed over on resume (named, with what is wrong with it)."""


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
    config_yaml: str | None = None,
    extra_files: dict[str, bytes] | None = None,
) -> Path:
    """Write `ckpt_dir/step_<step>` atomically and return its path; keep only the newest `keep` checkpoints.
    `config_yaml`: the run's resolved config, kept beside the states (a resume compares its own config with it).
    `extra_files`: more files of the trainer's (name -> bytes; the rollouts an asynchronous run produced ahead),
    in the manifest like every other file; in a sharded checkpoint rank 0's are written (with its trainer state).
    A sharded model (FSDP2 / tensor parallel) is written by every rank with DCP (`_save_sharded`).
    Raises CheckpointWriteError (no space, an OS error: the path named, no partial folder left)."""
    from seedfast.distributed.checkpoint import is_sharded

    if is_sharded(model):
        return _save_sharded(Path(ckpt_dir), step, model, optimizer, scheduler, trainer_state, generators, keep,
                             config_yaml, extra_files)
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"step_{step}"
    tmp = ckpt_dir / f".step_{step}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    check_free_space(ckpt_dir, state_bytes(model, optimizer) + _SLACK_BYTES)
    with _removed_unless_published(tmp):
        tmp.mkdir()
        out = CheckpointWriter(tmp)
        # a LoRA model's checkpoint holds its adapters; the frozen base is named and hashed (lora_base.json)
        state = adapter_state_dict(model) if has_lora(model) else model.state_dict()
        tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
        out.file("model.safetensors", lambda path: save_file(tensors, path))
        if has_lora(model):
            out.stream(BASE_FILE, lambda f: f.write(base_record(model)))
        states = {
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng": rng_state(generators),
        }
        out.stream("state.pt", lambda f: torch.save(states, f))
        for name, data in (extra_files or {}).items():
            out.stream(name, lambda f, data=data: f.write(data))
        _finish(out, step, trainer_state, config_yaml)
        _publish(tmp, final, keep)
    return final


CONFIG_FILE = "config.yaml"  # the run's resolved config when the checkpoint was written (the resume diff's base)


def _finish(out: CheckpointWriter, step: int, trainer_state: dict, config_yaml: str | None) -> None:
    """The files every checkpoint ends with, one- or many-process: the trainer state, the run's config, the manifest
    of every file, then COMPLETE (after the manifest, which does not list it)."""
    out.text("trainer_state.json", json.dumps({"step": step, **trainer_state}, indent=1))
    if config_yaml is not None:
        out.text(CONFIG_FILE, config_yaml)
    out.write_manifest()
    out.text(_COMPLETE, "ok\n")


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    """The bytes of this process's model and optimizer tensors: what a checkpoint of them needs on disk, about (of a
    LoRA model, the adapters': the checkpoint leaves the frozen base out)."""
    state = adapter_state_dict(model) if has_lora(model) else model.state_dict()
    total = sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))
    if optimizer is not None:
        for per_param in optimizer.state.values():
            total += sum(t.numel() * t.element_size() for t in per_param.values() if isinstance(t, torch.Tensor))
    return total


class _removed_unless_published:
    """Any failure while `tmp` is written (an error, KeyboardInterrupt, the trainer's stop signal) removes `tmp`
    before it propagates: no partial folder stays, and the previous checkpoint stays the newest."""

    def __init__(self, tmp: Path | None) -> None:
        self.tmp = tmp  # None: another rank owns the folder

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None and self.tmp is not None and self.tmp.exists():
            shutil.rmtree(self.tmp, ignore_errors=True)


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
                  generators: dict[str, torch.Generator] | None, keep: int | None,
                  config_yaml: str | None = None, extra_files: dict[str, bytes] | None = None) -> Path:
    """Every rank writes its model and optimizer shards (DCP) and its RNG state into the temporary folder, and
    hashes its own files; rank 0 then writes the scheduler, its extra files, the trainer state and the manifest of
    every rank's files, marks it complete and renames it into place, as above. Ranks wait for each other before and
    after, so no rank reads a half-written checkpoint, and a failure on any rank is raised on every rank
    (`together`), the partial folder removed by rank 0."""
    from seedfast.distributed.checkpoint import DCP_DIR, rank_and_world, save_states, together

    rank, world = rank_and_world()
    final = ckpt_dir / f"step_{step}"
    tmp = ckpt_dir / f".step_{step}.tmp"
    needed = state_bytes(model, optimizer) * world + _SLACK_BYTES  # about equal shards

    def prepare() -> None:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        check_free_space(ckpt_dir, needed)
        tmp.mkdir()

    together(prepare if rank == 0 else None)
    out = CheckpointWriter(tmp)
    with _removed_unless_published(tmp if rank == 0 else None):
        save_states(tmp, model, optimizer)  # DCP raises a failed write on every rank

        def write_own() -> dict[str, Any]:
            out.stream(f"rng_rank{rank}.pt", lambda f: torch.save(rng_state(generators), f))
            own = [f"{DCP_DIR}/{p.name}" for p in (tmp / DCP_DIR).iterdir() if p.name.startswith(f"__{rank}_")]
            out.add_existing(own + ([f"{DCP_DIR}/.metadata"] if rank == 0 else []))
            return out.files

        every_rank_files = together(write_own)

        def publish() -> None:
            for files in every_rank_files:
                out.files.update(files)
            out.stream("state.pt", lambda f: torch.save(
                {"scheduler": scheduler.state_dict() if scheduler is not None else None, "world": world}, f))
            if has_lora(model):  # dcp/ holds the adapters; the frozen base is named and hashed here
                out.stream(BASE_FILE, lambda f: f.write(base_record(model)))
            for name, data in (extra_files or {}).items():
                out.stream(name, lambda f, data=data: f.write(data))
            _finish(out, step, trainer_state, config_yaml)
            _publish(tmp, final, keep)

        together(publish if rank == 0 else None)
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
    verify: bool = True,
) -> dict[str, Any]:
    """Restore everything saved by `save_checkpoint`; returns the trainer state (with `step`). The files are
    checked against the manifest first (`verify`); a CheckpointError names the file and what is wrong with it."""
    path = Path(path)
    if not (path / _COMPLETE).exists():
        raise CheckpointError(f"checkpoint {path} is incomplete or missing (no {_COMPLETE} marker)")
    if verify:
        problems = verify_files(path)
        if problems:
            raise CheckpointError(f"checkpoint {path} is damaged: " + "; ".join(problems))
    from seedfast.distributed.checkpoint import has_states, is_sharded

    if has_states(path):
        return _load_sharded(path, model, optimizer, scheduler, generators)
    if is_sharded(model):
        raise CheckpointError(f"checkpoint {path} was written by one process (model.safetensors); resume it with "
                              "dist.strategy=none, or start the sharded run from an HF export (trainer.init_from)")
    tensors = _read(path / "model.safetensors", "safetensors file", load_file)
    _check_base(path, model)
    if has_lora(model):
        try:
            load_adapter_state(model, tensors, source=f"checkpoint {path}")
        except ValueError as err:
            raise CheckpointError(str(err)) from None
    else:
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        if missing or unexpected:
            raise CheckpointError(f"checkpoint {path} does not fit the model: missing {missing}, unexpected "
                                  f"{unexpected}")
    state = _read(path / "state.pt", "torch.save file", _torch_load)
    _restore(path / "state.pt", lambda: optimizer.load_state_dict(state["optimizer"]),
             optimizer is not None and state["optimizer"] is not None)
    _restore(path / "state.pt", lambda: scheduler.load_state_dict(state["scheduler"]),
             scheduler is not None and state["scheduler"] is not None)
    _restore(path / "state.pt", lambda: set_rng_state(state["rng"], generators), True)
    return _trainer_state(path)


def _check_base(path: Path, model: torch.nn.Module) -> None:
    """A LoRA checkpoint resumes only onto the base it adapted (its SHA-256), and a full one only without LoRA."""
    record = path / BASE_FILE
    if has_lora(model) != record.is_file():
        kind = "LoRA adapters" if record.is_file() else "full weights"
        raise CheckpointError(f"checkpoint {path} holds {kind}; this run {'has' if has_lora(model) else 'has no'} "
                              "LoRA (model.lora)")
    if not has_lora(model):
        return
    saved = _read(record, "JSON file", lambda p: json.loads(p.read_text()))
    own = json.loads(base_record(model))
    if saved.get("sha256") != own.get("sha256"):
        raise CheckpointError(f"checkpoint {path} adapts the base {saved.get('path')} (sha256 "
                              f"{str(saved.get('sha256'))[:12]}...); this run's base is {own.get('path')} (sha256 "
                              f"{str(own.get('sha256'))[:12]}...)")


def _torch_load(path: Path) -> Any:
    return torch.load(path, weights_only=False)


def _read(path: Path, kind: str, read: Callable[[Path], Any]) -> Any:
    """read(path), a failure turned into a CheckpointError naming the file."""
    try:
        return read(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except Exception as err:  # noqa: BLE001 - every reader's own error type (SafetensorError, UnpicklingError ...)
        raise CheckpointError(f"{path}: not a readable {kind} ({type(err).__name__}: {err})") from None


def _restore(path: Path, apply: Callable[[], Any], wanted: bool) -> None:
    if not wanted:
        return
    try:
        apply()
    except (KeyError, ValueError, TypeError, RuntimeError) as err:
        raise CheckpointError(f"{path}: its states do not fit this run ({type(err).__name__}: {err})") from None


def _trainer_state(path: Path) -> dict[str, Any]:
    state = _read(path / "trainer_state.json", "JSON file", lambda p: json.loads(p.read_text()))
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise CheckpointError(f"{path / 'trainer_state.json'}: no integer 'step'")
    return state


def resume_latest(ckpt_dir: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                  scheduler: Any | None = None, generators: dict[str, torch.Generator] | None = None,
                  before_load: Callable[[Path], None] | None = None) -> tuple[Path, dict[str, Any]] | None:
    """`--resume auto`: load the newest checkpoint of `ckpt_dir` that verifies and loads, and return (its path, the
    trainer state); None when there is no complete checkpoint at all (a fresh start). A damaged checkpoint is named
    in a CheckpointWarning and the next newest is tried; when none works, one CheckpointError names each one tried
    and what was wrong with it. Stale temporary folders of a killed write are removed first. `before_load(path)`
    runs on the chosen checkpoint before its states are loaded (the resume's config comparison; its error stops).

    Sharded (a process group): the ranks split the checking of the files, agree on each verdict, and so load the
    same step; a load that fails after the files verified is raised (DCP's load is a collective)."""
    from seedfast.distributed.checkpoint import rank_and_world, together

    ckpt_dir = Path(ckpt_dir)
    rank, world = rank_and_world()
    together(lambda: remove_stale_temporaries(ckpt_dir) if rank == 0 else None)
    tried = []
    for path in reversed(list_checkpoints(ckpt_dir)):
        problems = [p for found in together(lambda path=path: verify_files(path, share=(rank, world))) for p in found]
        if not problems:
            if before_load is not None:
                before_load(path)
            try:
                return path, load_checkpoint(path, model, optimizer, scheduler, generators, verify=False)
            except CheckpointError as err:
                if world > 1:
                    raise
                problems = [str(err)]
        tried.append(f"{path.name}: {'; '.join(problems)}")
        if rank == 0:
            warnings.warn(f"checkpoint {path} is damaged, not resumed from: {'; '.join(problems)}",
                          CheckpointWarning, stacklevel=2)
    if tried:
        raise CheckpointError(f"no usable checkpoint in {ckpt_dir} to resume from; tried " + " | ".join(tried))
    return None


def _load_sharded(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, scheduler: Any | None,
                  generators: dict[str, torch.Generator] | None) -> dict[str, Any]:
    """A checkpoint written by `_save_sharded` on any number of ranks, into this model however it is sharded (DCP
    reshards). The RNG state is this rank's when the checkpoint has one (same rank count), else rank 0's. A LoRA
checkpoint (adapters and their optimizer states; lora_base.json) loads only onto the base it names (`_check_base`)."""
    from seedfast.distributed.checkpoint import load_states, rank_and_world

    _check_base(path, model)  # a LoRA checkpoint onto its own base only, as in one process
    try:
        load_states(path, model, optimizer)
    except Exception as err:  # noqa: BLE001 - DCP's CheckpointException and the readers' errors beneath it
        raise CheckpointError(f"{path / 'dcp'}: not a readable DCP checkpoint ({type(err).__name__}: {err})") from None
    state = _read(path / "state.pt", "torch.save file", _torch_load)
    _restore(path / "state.pt", lambda: scheduler.load_state_dict(state["scheduler"]),
             scheduler is not None and state["scheduler"] is not None)
    rank, world = rank_and_world()
    rng_file = path / f"rng_rank{rank if world == state['world'] else 0}.pt"
    rng = _read(rng_file, "torch.save file", _torch_load)
    _restore(rng_file, lambda: set_rng_state(rng, generators), True)
    return _trainer_state(path)
