"""A GGUF checkpoint (llama.cpp's single-file format) as an HF folder that `load_hf` and transformers read.

    gguf_to_hf("SmolLM2-135M-Instruct.Q4_1.gguf", "models/smollm2")   # config.json, model.safetensors, tokenizer

transformers' own GGUF loader does the work: it dequantizes every tensor (Q4_1, Q8_0, ...) and rebuilds the
tokenizer from the file's vocabulary and merges. Two things are fixed on top of it:

1. transformers 5 marks a GGUF-loaded model as quantized and refuses to save it, so a plain model is rebuilt
   from its config and given the dequantized weights before `save_pretrained`.
2. A byte-level vocabulary whose split rule transformers does not know (`tokenizer.ggml.pre`, e.g. 'smollm')
   falls back to GPT-2's split there; the rule llama.cpp uses for it is set here instead (PRE_TOKENIZERS).

The folder is written to a temporary sibling first and renamed into place, so a reader never sees half of one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from tokenizers import pre_tokenizers

from .tokenizer import save_tokenizer


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    # llama.cpp (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_SMOLLM): every digit alone, then GPT-2's split
    return pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])


# tokenizer.ggml.pre -> the pre-tokenizer its merges were learned with, where transformers would use another
PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "smollm": _digits_then_gpt2,
}


def gguf_metadata(gguf_file: str | os.PathLike, key: str) -> str | int | float | None:
    """One scalar or string field of a GGUF file's header (None when the file has no such key)."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_file)).fields.get(key)
    return None if field is None else field.contents()


def load_gguf_tokenizer(gguf_file: str | os.PathLike):
    """The file's tokenizer through transformers, with the pre-tokenizer of PRE_TOKENIZERS where one applies."""
    from transformers import AutoTokenizer

    path = Path(gguf_file)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    pre = gguf_metadata(path, "tokenizer.ggml.pre")
    if pre in PRE_TOKENIZERS:
        tokenizer.backend_tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre]()
    return tokenizer


def load_gguf_model(gguf_file: str | os.PathLike, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The file's weights, dequantized, in a plain (not 'quantized') transformers *ForCausalLM of `dtype`."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(gguf_file)
    kwargs = {}
    if hasattr(transformers, "GgufConfig"):  # transformers 5: ask for dense weights even where kernels exist
        kwargs["quantization_config"] = transformers.GgufConfig(dequantize=True)
    loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype,
                                                  local_files_only=True, **kwargs)
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)
    config = AutoConfig.for_model(**config)
    plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    return plain.eval()


def gguf_to_hf(gguf_file: str | os.PathLike, out_dir: str | os.PathLike,
               dtype: torch.dtype = torch.float32) -> Path:
    """Write the GGUF's model (dequantized, in `dtype`) and tokenizer as an HF folder `out_dir`; returns it.

    An existing `out_dir` is replaced only once the new folder is complete."""
    path, out = Path(gguf_file), Path(out_dir)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {str(path)!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would otherwise become the folder's mode
    try:
        load_gguf_model(path, dtype).save_pretrained(tmp)
        save_tokenizer(load_gguf_tokenizer(path), tmp)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.replace(out, old / out.name)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
