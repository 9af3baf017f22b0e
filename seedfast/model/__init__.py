"""The decoder (Llama / Qwen2 / Qwen3, HF weight names), varlen attention backends, packed KV, HF checkpoint I/O."""

from .attention import BACKENDS, VarlenPlan, resolve_backend, varlen_attention
from .config import SUPPORTED_MODEL_TYPES, DecoderConfig
from .decoder import Decoder, build_decoder
from .hf_io import hf_config, is_hf_folder, load_hf, parameter_count, save_hf
from .kv import PackedKV, StaticKVCache
from .packing import make_cu_seqlens

__all__ = [
    "BACKENDS",
    "SUPPORTED_MODEL_TYPES",
    "Decoder",
    "DecoderConfig",
    "PackedKV",
    "StaticKVCache",
    "VarlenPlan",
    "build_decoder",
    "hf_config",
    "is_hf_folder",
    "load_hf",
    "parameter_count",
    "make_cu_seqlens",
    "resolve_backend",
    "save_hf",
    "varlen_attention",
]
