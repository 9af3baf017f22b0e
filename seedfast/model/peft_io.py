"""PEFT's LoRA adapter folder, written and read without importing peft: `adapter_config.json` and
`adapter_model.safetensors`, the format `peft.PeftModel.from_pretrained` loads onto transformers' model.

    save_peft_adapter(model, "runs/x/adapter", base_model="HuggingFaceTB/SmolLM2-135M-Instruct")
    spec = read_peft_spec("runs/x/adapter")                 # LoRASpec(rank, alpha, targets) of the folder
    load_peft_adapter(model, "runs/x/adapter")              # into a model that add_lora(model, spec) adapted

PEFT's tensor names are the module path under `base_model.model.` with `.lora_A.weight` / `.lora_B.weight` (the
adapter's name, `default`, is left out on disk); lora_A is [r, in], lora_B [out, r], as seedfast holds them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .lora import LORA_TARGETS, LoRASpec, adapter_state_dict, load_adapter_state, lora_spec_of

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."
# adapter_config.json keys whose non-default values would change what the adapter computes; seedfast refuses them
# rather than load an adapter it would run differently from PEFT
_UNSUPPORTED = {"use_dora": False, "use_rslora": False, "fan_in_fan_out": False, "bias": "none",
                "modules_to_save": None, "layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {}}


def is_peft_adapter(path: str | os.PathLike) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def save_peft_adapter(model: torch.nn.Module, path: str | os.PathLike, base_model: str | None = None,
                      dtype: torch.dtype = torch.float32) -> Path:
    """Write the model's adapters as a PEFT LoRA folder at `path` (atomically: a temporary folder renamed into place,
    or its files moved in one at a time into an existing folder)."""
    spec = lora_spec_of(model)
    if spec is None:
        raise ValueError("save_peft_adapter: the model has no LoRA adapters")
    tensors = {_PREFIX + name + ".weight": t.to(dtype).contiguous().cpu()
               for name, t in adapter_state_dict(model).items()}
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": spec.rank, "lora_alpha": spec.alpha,
        "target_modules": sorted(spec.targets), "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "use_rslora": False, "use_dora": False, "init_lora_weights": True, "modules_to_save": None,
        "inference_mode": True, "base_model_name_or_path": base_model,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if not path.exists():
            os.rename(tmp, path)
            return path
        for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG):
            os.replace(tmp / name, path / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def read_peft_spec(path: str | os.PathLike) -> LoRASpec:
    """The LoRASpec of a PEFT LoRA folder; a setting seedfast would compute differently is one error naming it."""
    file = Path(path) / ADAPTER_CONFIG
    try:
        config = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{file}: not a readable adapter config ({type(err).__name__}: {err})") from None
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{file}: peft_type is {config.get('peft_type')!r}; seedfast reads LoRA adapters (LORA)")
    for key, default in _UNSUPPORTED.items():
        value = config.get(key)
        if value not in (None, default) and value not in ([], {}):
            raise ValueError(f"{file}: {key}={value!r} is not supported (seedfast's LoRA has {key}={default!r})")
    targets = config.get("target_modules")
    if not isinstance(targets, list) or set(targets) - set(LORA_TARGETS) or not targets:
        raise ValueError(f"{file}: target_modules={targets!r}; seedfast reads a list of names among {LORA_TARGETS}")
    try:
        return LoRASpec(rank=int(config["r"]), alpha=float(config["lora_alpha"]),
                        targets=tuple(t for t in LORA_TARGETS if t in targets))
    except KeyError as err:
        raise ValueError(f"{file}: no {err.args[0]!r}") from None
    except ValueError as err:
        raise ValueError(f"{file}: {err}") from None


def load_peft_adapter(model: torch.nn.Module, path: str | os.PathLike) -> None:
    """Copy a PEFT LoRA folder's tensors into the adapters of `model` (adapted with the folder's spec)."""
    spec, own = read_peft_spec(path), lora_spec_of(model)
    if own is None or (own.rank, own.alpha, set(own.targets)) != (spec.rank, spec.alpha, set(spec.targets)):
        raise ValueError(f"{path}: the adapter is r={spec.rank}, alpha={spec.alpha:g}, targets {spec.targets}; the "
                         f"model's LoRA is {own}")
    file = Path(path) / ADAPTER_WEIGHTS
    try:
        raw = load_file(str(file))
    except Exception as err:  # noqa: BLE001 - safetensors' own error types
        raise ValueError(f"{file}: not a readable safetensors file ({type(err).__name__}: {err})") from None
    state = {}
    for key, tensor in raw.items():
        name = key.removeprefix(_PREFIX).removesuffix(".weight").replace(".default", "")
        if not key.startswith(_PREFIX) or not key.endswith(".weight"):
            raise ValueError(f"{file}: tensor {key!r} is not a LoRA weight (base_model.model.<path>.lora_A.weight)")
        state[name] = tensor
    own_dtype = {name: t.dtype for name, t in adapter_state_dict(model).items()}
    load_adapter_state(model, {k: v.to(own_dtype.get(k, v.dtype)) for k, v in state.items()}, source=str(file))
