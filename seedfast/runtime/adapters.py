"""LoRA from the config, for every command that trains (docs/algorithms.md, 'LoRA'): the adapters' spec (model.lora,
or the PEFT folder of model.lora.adapter), the adapted policy, and the identity of the frozen base that checkpoints
name and hash instead of copying it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from seedfast.config import Config, ConfigError
from seedfast.config.schema import LoRAConfig
from seedfast.model.lora import LoRASpec, add_lora, has_lora
from seedfast.model.peft_io import load_peft_adapter, read_peft_spec

BASE_FILE = "lora_base.json"  # a LoRA checkpoint's record of the base it adapts (runtime/checkpoint.py)


def uses_lora(cfg: Config) -> bool:
    return cfg.model.lora.rank > 0 or cfg.model.lora.adapter is not None


def lora_spec(cfg: Config) -> LoRASpec | None:
    """The run's LoRASpec: model.lora's, or the adapter folder's when model.lora.adapter is set (a model.lora.rank
    set beside it must agree); None for full fine-tuning."""
    lora = cfg.model.lora
    if not uses_lora(cfg):
        return None
    if lora.adapter is None:
        return LoRASpec(rank=lora.rank, alpha=lora.alpha, targets=tuple(lora.targets))
    try:
        spec = read_peft_spec(lora.adapter)
    except ValueError as err:
        raise ConfigError(f"model.lora.adapter: {err}") from None
    if lora.rank and lora.rank != spec.rank:
        raise ConfigError(f"model.lora.rank={lora.rank} but model.lora.adapter={lora.adapter!r} has r={spec.rank}; "
                          "leave model.lora.rank at 0 to take the adapter's")
    # alpha and targets set away from their defaults must agree with the folder's too (the folder's are used)
    default = LoRAConfig()
    if lora.alpha != default.alpha and lora.alpha != spec.alpha:
        raise ConfigError(f"model.lora.alpha={lora.alpha:g} but model.lora.adapter={lora.adapter!r} has lora_alpha="
                          f"{spec.alpha:g}; leave model.lora.alpha unset to take the adapter's")
    if list(lora.targets) != list(default.targets) and set(lora.targets) != set(spec.targets):
        raise ConfigError(f"model.lora.targets={list(lora.targets)} but model.lora.adapter={lora.adapter!r} adapts "
                          f"{list(spec.targets)}; leave model.lora.targets unset to take the adapter's")
    return spec


def attach_adapters(cfg: Config, model: torch.nn.Module, base: Path | None) -> torch.nn.Module:
    """Freeze `model` (the base, in model.dtype) and add the run's adapters in optim.master_dtype, seeded by run.seed,
    or loaded from model.lora.adapter; `base` is the policy folder the base came from (None: built here)."""
    from seedfast.runtime.precision import precision_of

    spec = lora_spec(cfg)
    add_lora(model, spec, seed=cfg.run.seed, dtype=precision_of(cfg).master)
    if cfg.model.lora.adapter is not None:
        try:
            load_peft_adapter(model, cfg.model.lora.adapter)
        except ValueError as err:
            raise ConfigError(f"model.lora.adapter: {err}") from None
    model.lora_base = base_identity(base)
    return model


def base_identity(folder: Path | None) -> dict[str, Any]:
    """{"path", "sha256"}: the policy folder of the frozen base and the SHA-256 of its weight files in name order
    (what a LoRA checkpoint holds instead of the base's weights)."""
    if folder is None:
        return {"path": None, "sha256": None}
    from seedfast.model.hf_io import weight_files

    h = hashlib.sha256()
    for file in weight_files(Path(folder)):
        h.update(file.name.encode())
        with open(file, "rb") as f:
            while block := f.read(1 << 24):
                h.update(block)
    return {"path": str(folder), "sha256": h.hexdigest()}


def base_record(model: torch.nn.Module) -> bytes | None:
    """The checkpoint file that names and hashes the base of an adapted model (None: the model has no adapters)."""
    if not has_lora(model):
        return None
    return (json.dumps(getattr(model, "lora_base", {"path": None, "sha256": None}), indent=2) + "\n").encode()
