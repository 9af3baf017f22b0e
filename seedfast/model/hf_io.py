"""Load and save HF checkpoints (config.json + safetensors, sharded with model.safetensors.index.json).

Names are identical on both sides, so loading is a strict state-dict load. Two kinds of extra tensors that HF
checkpoints may carry are ignored: `lm_head.weight` of a tied model, and old `rotary_emb.inv_freq` buffers.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .config import DecoderConfig
from .decoder import Decoder
from .lora import base_state_dict, merged_state_dict

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1000**3


class WeightsFileError(ValueError):
    """A file of an HF model folder that cannot be read (truncated, garbled, not what its name says): the message
    names the file and the reader's complaint."""


def is_hf_folder(path: str | os.PathLike) -> bool:
    """Whether `path` is an HF model folder: it holds config.json (the file every reader opens first)."""
    return (Path(path) / CONFIG_NAME).is_file()


def hf_config(path: str | os.PathLike) -> DecoderConfig:
    """The architecture of the HF model folder `path`, from its config.json."""
    file = Path(path) / CONFIG_NAME
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise WeightsFileError(f"{file}: not a readable JSON file ({type(err).__name__}: {err})") from None
    return DecoderConfig.from_hf(data)


def load_hf(
    path: str | os.PathLike,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    attn_backend: str = "auto",
) -> Decoder:
    """A Decoder with the weights of the HF checkpoint folder `path` (dtype None: as stored)."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"checkpoint path {str(path)!r} does not exist or is not a directory")
    if not is_hf_folder(path):
        raise ValueError(f"checkpoint {str(path)!r} has no {CONFIG_NAME}")
    config = hf_config(path)
    with torch.device("meta"):
        model = Decoder(config, attn_backend=attn_backend)
    expected = set(model.state_dict())
    state = _read_safetensors(path, expected, dtype, torch.device(device))
    missing = sorted(expected - set(state))
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {str(path)!r} does not match its {config.model_type} config: "
            f"missing tensors {missing[:10]}{' ...' if len(missing) > 10 else ''}, "
            f"unexpected tensors {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}"
        )
    for name, param in model.state_dict().items():
        if state[name].shape != param.shape:
            raise ValueError(
                f"tensor {name!r} in {str(path)!r} has shape {tuple(state[name].shape)}, "
                f"the config implies {tuple(param.shape)}"
            )
    model.load_state_dict(state, strict=True, assign=True)
    dtypes = {t.dtype for t in state.values()}
    if len(dtypes) == 1:
        config.dtype = str(dtypes.pop()).removeprefix("torch.")
    return model


def save_hf(
    model: Decoder,
    path: str | os.PathLike,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    state_dict: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write config.json + safetensors (sharded with an index above max_shard_bytes) to the folder `path`.

    Files are written to a temporary folder first. A new folder is then renamed into place; into an existing
    folder each file is moved with an atomic rename, stale weight files of an earlier save are removed, and
    other files (e.g. a tokenizer) are left alone. `state_dict` overrides the model's own (e.g. a full state
    dict gathered from sharded training); a LoRA model's own is its merged weights (model/lora.py)."""
    if not isinstance(model, Decoder):
        raise TypeError(f"model must be a seedfast Decoder, got {type(model).__name__}")
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be > 0, got {max_shard_bytes}")
    # an adapted model is saved merged (W + s·B·A): the folder is a plain HF model (model/lora.py)
    state = dict(state_dict if state_dict is not None else merged_state_dict(model))
    expected = set(base_state_dict(model))
    if set(state) != expected:
        raise ValueError(
            f"state_dict names differ from the model's: missing {sorted(expected - set(state))[:10]}, "
            f"unexpected {sorted(set(state) - expected)[:10]}"
        )
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"save path {str(path)!r} exists and is not a directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        config = model.config.to_hf_dict()
        dtypes = {t.dtype for t in state.values()}
        if len(dtypes) == 1:
            dtype_name = str(dtypes.pop()).removeprefix("torch.")
            config.update(dtype=dtype_name, torch_dtype=dtype_name)
        written = _write_weights(state, tmp, max_shard_bytes)
        (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        if not path.exists():
            os.rename(tmp, path)
            return path
        _move_into(tmp, path, [*written, CONFIG_NAME])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def parameter_count(path: str | os.PathLike) -> int:
    """The decoder's parameters from its weight files' headers, nothing loaded (a tied LM head counted once)."""
    path = Path(path)
    tied = hf_config(path).tie_word_embeddings
    count = 0
    for file in weight_files(path):
        with safe_open(str(file), framework="pt") as f:
            count += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys()
                         if not (name.endswith("rotary_emb.inv_freq") or (tied and name == "lm_head.weight")))
    return count


def _shard_names(count: int) -> list[str]:
    if count == 1:
        return [WEIGHTS_NAME]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def _write_weights(state: dict[str, torch.Tensor], folder: Path, max_shard_bytes: int) -> list[str]:
    shards: list[list[str]] = [[]]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    files = _shard_names(len(shards))
    weight_map = {}
    for file, names in zip(files, shards):
        tensors = {n: state[n].detach().to("cpu").contiguous() for n in names}
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, file))
    if len(files) == 1:
        return files
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    return [*files, INDEX_NAME]


def _move_into(src: Path, dst: Path, names: list[str]) -> None:
    stale = [p for p in dst.iterdir() if _is_weight_file(p.name) and p.name not in names]
    for name in names:  # config.json last: a reader that sees the new config finds the new weights
        os.replace(src / name, dst / name)
    for p in stale:
        p.unlink()


def _is_weight_file(name: str) -> bool:
    return name == INDEX_NAME or (name.startswith("model") and name.endswith(".safetensors"))


def weight_files(path: Path) -> list[Path]:
    index = path / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as err:
            raise WeightsFileError(f"{index}: not a readable JSON index ({type(err).__name__}: {err})") from None
        if not isinstance(weight_map, dict):
            raise WeightsFileError(f"{index} has no weight_map")
        files = [path / f for f in sorted(set(weight_map.values()))]
    elif (path / WEIGHTS_NAME).is_file():
        files = [path / WEIGHTS_NAME]
    else:
        raise ValueError(f"checkpoint {str(path)!r} has neither {WEIGHTS_NAME} nor {INDEX_NAME}")
    absent = [f.name for f in files if not f.is_file()]
    if absent:
        raise WeightsFileError(f"checkpoint {str(path)!r} is missing weight files {absent}")
    return files


def _ignored(name: str, expected: set[str]) -> bool:
    return name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and name not in expected)


def _read_safetensors(
    path: Path, expected: set[str], dtype: torch.dtype | None, device: torch.device
) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for file in weight_files(path):
        try:
            with safe_open(str(file), framework="pt", device=str(device)) as f:
                for name in f.keys():
                    if _ignored(name, expected):
                        continue
                    tensor = f.get_tensor(name)
                    state[name] = tensor.to(dtype) if dtype is not None else tensor
        except Exception as err:  # noqa: BLE001 - SafetensorError, OSError ...: the file is named either way
            raise WeightsFileError(f"{file}: not a readable safetensors file ({type(err).__name__}: {err})") from None
    return state
