"""PEFT's LoRA adapter folder, written and read without importing peft: `adapter_config.json` and
`adapter_model.safetensors`, the format `peft.PeftModel.from_pretrained` loads onto transformers' model.

    save_peft_adapter(model, "runs/x/adapter", base_model="HuggingFaceTB/SmolLM2-135M-Instruct")
    spec = read_peft_spec("runs/x/adapter")                 # LoRASpec(rank, alpha, targets) of the folder
    load_peft_adapter(model, "runs/x/adapter")              # into a model that add_lora(model, spec) adapted

PEFT's tensor names are the module path under `base_model.model.` with `.lora_A.weight` / `.lora_B.weight` (the
adapter's name, `default`, is left out on disk: peft 0.21 writes and reads them so; a name in there is read too);
lora_A is [r, in], lora_B [out, r], as seedfast holds them. target_modules is read as PEFT matches it (a module name,
or a module path ending in one: what PEFT saves for 'all-linear'), and must adapt what seedfast adapts: each named
module of every decoder block. A setting that PEFT would compute differently (DoRA, rsLoRA, patterns, biases, ...)
is refused with its key named.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .lora import LORA_TARGETS, LoRASpec, adapter_state_dict, load_adapter_state, lora_spec_of

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."
# a tensor of the folder: base_model.model.<module path>.lora_A|lora_B[.<adapter name>].weight (PEFT leaves the
# adapter's name out on disk; a state dict taken from a live PeftModel has it)
_TENSOR = re.compile(r"base_model\.model\.(?P<path>.+)\.(?P<kind>lora_A|lora_B)(?:\.[^.]+)?\.weight")
# adapter_config.json keys whose other values would change what the adapter computes (or what it adapts, or the base
# it runs on): seedfast refuses them rather than load an adapter it would run differently from PEFT
_UNSUPPORTED = {"use_dora": False, "use_rslora": False, "fan_in_fan_out": False, "bias": "none", "lora_bias": False,
                "modules_to_save": None, "layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {},
                "exclude_modules": None, "layer_replication": None, "target_parameters": None,
                "trainable_token_indices": None, "alora_invocation_tokens": None, "use_qalora": False,
                "use_bdlora": None, "arrow_config": None, "velora_config": None, "kasa_config": None,
                "monteclora_config": None}
# init_lora_weights of a plain adapter (one trained on the unchanged base): PiSSA, OLoRA, CorDA, LoftQ and LoRA-GA
# subtract their initial B·A from the base (or quantize it), so such an adapter is PEFT's to convert to a plain one
_PLAIN_INITS = (True, False, "gaussian", "eva", "orthogonal", "mica")
# target_modules entries PEFT matches against a module path (equal, or a suffix after a '.'): a bare name, or the end
# of model.layers.<i>.self_attn|mlp.<name> ('all-linear' is saved expanded to full paths)
_TARGET = re.compile(r"(?:(?:(?:model\.)?layers\.)?\d+\.)?(?:(?:self_attn|mlp)\.)?(?P<name>\w+)")


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
    return _read_config(path)[0]


def _read_config(path: str | os.PathLike) -> tuple[LoRASpec, dict]:
    file = Path(path) / ADAPTER_CONFIG
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{file}: not a readable adapter config ({type(err).__name__}: {err})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{file}: not a JSON object")
    if config.get("peft_type") != "LORA":
        raise ValueError(f"{file}: peft_type is {config.get('peft_type')!r}; seedfast reads LoRA adapters (LORA)")
    for key, default in _UNSUPPORTED.items():
        value = config.get(key)
        if not (value is None or value == default or value in ([], {})):
            raise ValueError(f"{file}: {key}={value!r} is not supported (seedfast's LoRA has {key}={default!r})")
    init = config.get("init_lora_weights", True)
    if init not in _PLAIN_INITS:
        raise ValueError(f"{file}: init_lora_weights={init!r} is not supported: such an adapter is trained against "
                         "a base PEFT changed (less its initial B·A, or quantized); convert it to a plain LoRA "
                         "adapter with PEFT first")
    targets = _target_names(config.get("target_modules"), file)
    for key in ("r", "lora_alpha"):
        if key not in config:
            raise ValueError(f"{file}: no {key!r}")
    r, alpha = config["r"], config["lora_alpha"]
    if isinstance(r, bool) or not isinstance(r, int):
        raise ValueError(f"{file}: r={r!r} is not an integer")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise ValueError(f"{file}: lora_alpha={alpha!r} is not a number")
    try:
        spec = LoRASpec(rank=r, alpha=float(alpha), targets=tuple(t for t in LORA_TARGETS if t in targets))
    except ValueError as err:
        raise ValueError(f"{file}: {err}") from None
    return spec, config


def _target_names(entries: object, file: Path) -> set[str]:
    """The module names of target_modules: a list of names among LORA_TARGETS or module paths ending in one (what
    PEFT saves for 'all-linear'); 'all-linear' itself is all of them. A regex string is an error."""
    if isinstance(entries, str):
        if entries.lower() == "all-linear":
            return set(LORA_TARGETS)
        raise ValueError(f"{file}: target_modules={entries!r} is a regular expression; seedfast reads a list of "
                         f"module names among {LORA_TARGETS}")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, str) for e in entries):
        raise ValueError(f"{file}: target_modules={entries!r}; seedfast reads a non-empty list of module names "
                         f"among {LORA_TARGETS}")
    names = set()
    for entry in entries:
        match = _TARGET.fullmatch(entry)
        if match is None or match["name"] not in LORA_TARGETS:
            raise ValueError(f"{file}: target_modules names {entry!r}, which seedfast does not adapt (it adapts "
                             f"{', '.join(LORA_TARGETS)} of the decoder blocks)")
        names.add(match["name"])
    return names


def _peft_targeted(entries: object, paths: list[str]) -> set[str]:
    """The paths among `paths` (the model's linear layers) that PEFT adapts for target_modules `entries`: a path equal
    to an entry or ending in '.' + entry; 'all-linear': all of them but the output layer."""
    if isinstance(entries, str):
        return {p for p in paths if p.rsplit(".", 1)[-1] != "lm_head"}
    return {p for p in paths if any(p == e or p.endswith("." + e) for e in entries)}


def load_peft_adapter(model: torch.nn.Module, path: str | os.PathLike) -> None:
    """Copy a PEFT LoRA folder's tensors into the adapters of `model` (adapted with the folder's spec): a module PEFT
    would adapt differently, or a missing, unexpected, misshapen or non-finite tensor, is one error naming it."""
    (spec, config), own = _read_config(path), lora_spec_of(model)
    dropout = config.get("lora_dropout") or 0.0
    if dropout:
        warnings.warn(f"{Path(path) / ADAPTER_CONFIG}: lora_dropout={dropout!r}: seedfast trains adapters without "
                      "dropout (a policy that drops units would sample and score different policies; "
                      "docs/algorithms.md, 'LoRA'), so training goes on with none", UserWarning, stacklevel=2)
    if own is None:
        raise ValueError(f"{path}: the model has no LoRA adapters to load the adapter into (add_lora first)")
    if (own.rank, own.alpha, set(own.targets)) != (spec.rank, spec.alpha, set(spec.targets)):
        raise ValueError(f"{path}: the adapter is r={spec.rank}, lora_alpha={spec.alpha:g}, targets "
                         f"{list(spec.targets)}; the model's LoRA is r={own.rank}, alpha={own.alpha:g}, targets "
                         f"{list(own.targets)}")
    adapted = [name.removesuffix(".lora_A") for name in adapter_state_dict(model) if name.endswith(".lora_A")]
    linear = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    targeted = _peft_targeted(config["target_modules"], linear)
    if targeted != set(adapted):
        odd = sorted(set(adapted) ^ targeted)
        raise ValueError(f"{Path(path) / ADAPTER_CONFIG}: target_modules adapts {len(targeted)} modules of the "
                         f"model, seedfast every layer's {list(spec.targets)} ({len(adapted)}); they differ at "
                         f"{odd[:4]}{' ...' if len(odd) > 4 else ''}")
    file = Path(path) / ADAPTER_WEIGHTS
    if not file.is_file():
        raise ValueError(f"{file}: no such file (seedfast reads a PEFT adapter saved as safetensors)")
    try:
        raw = load_file(str(file))
    except Exception as err:  # noqa: BLE001 - safetensors' own error types
        raise ValueError(f"{file}: not a readable safetensors file ({type(err).__name__}: {err})") from None
    own_tensors = adapter_state_dict(model)
    state, keys = {}, {}
    for key, tensor in raw.items():
        match = _TENSOR.fullmatch(key)
        if match is None:
            raise ValueError(f"{file}: tensor {key!r} is not a LoRA weight of a linear layer "
                             "(base_model.model.<module path>.lora_A.weight / .lora_B.weight)")
        name = f"{match['path']}.{match['kind']}"
        if name in state:
            raise ValueError(f"{file}: tensors {keys[name]!r} and {key!r} are the same adapter's")
        state[name], keys[name] = tensor, key
    missing = sorted(set(own_tensors) - set(state))
    if missing:
        raise ValueError(f"{file}: no tensor {_PREFIX}{missing[0]}.weight"
                         f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}")
    unexpected = sorted(set(state) - set(own_tensors))
    if unexpected:
        raise ValueError(f"{file}: tensor {keys[unexpected[0]]!r} is not one of the model's adapters"
                         f"{f' (and {len(unexpected) - 1} more)' if len(unexpected) > 1 else ''}")
    for name, tensor in state.items():
        want = own_tensors[name]
        if tuple(tensor.shape) != tuple(want.shape):
            raise ValueError(f"{file}: tensor {keys[name]!r} has shape {tuple(tensor.shape)}, the model's adapter "
                             f"{tuple(want.shape)} (r={spec.rank})")
        if not tensor.is_floating_point() or not torch.isfinite(tensor).all():
            raise ValueError(f"{file}: tensor {keys[name]!r} is not finite floating point ({tensor.dtype})")
    load_adapter_state(model, {name: t.to(own_tensors[name].dtype) for name, t in state.items()}, source=str(file))
