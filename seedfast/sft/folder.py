"""Output folders written whole: into a fresh folder beside the final one, then swapped into place, so a reader
never sees half of one (the SFT policy, a tiny model's tokenizer)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from seedfast.model import save_hf
from seedfast.model.lora import merged_state_dict
from seedfast.model.tokenizer import save_tokenizer


def write_folder(final: Path, write: Callable[[Path], Any]) -> Path:
    """`write(tmp)` into a fresh folder beside `final`, then swap it into place (two renames)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result is an ordinary folder
    old = final.parent / f".{final.name}.old-{os.getpid()}"
    try:
        write(tmp)
        if final.exists():
            os.rename(final, old)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_policy(model: torch.nn.Module, tokenizer: Any, out: str | Path, dtype: torch.dtype,
                state: dict[str, torch.Tensor] | None = None) -> Path:
    """An HF folder (weights cast to `dtype`, config.json, tokenizer) written whole, then renamed to `out`.
    `state` (default: the model's own weights, a LoRA model's merged: model/lora.py) is e.g. the full state gathered
    from a sharded model."""
    state = merged_state_dict(model) if state is None else state
    state = {k: v.detach().to(dtype) if v.is_floating_point() else v for k, v in state.items()}

    def write(tmp: Path) -> None:
        weights = save_hf(model, tmp / "hf", state_dict=state)
        for f in weights.iterdir():
            os.rename(f, tmp / f.name)
        weights.rmdir()
        save_tokenizer(tokenizer, tmp)

    return write_folder(Path(out), write)
