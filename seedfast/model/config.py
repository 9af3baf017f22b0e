"""DecoderConfig: the architecture of a Llama / Qwen2 / Qwen3 decoder, read from and written to HF config.json.

Reading normalizes through the installed transformers (so missing keys get that family's HF defaults) and
accepts both rope styles: transformers 5.x `rope_parameters` and 4.x `rope_theta` + `rope_scaling`. Writing
emits both styles, so config.json loads back with either major version.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# rope_type -> the keys (besides rope_type) it needs
ROPE_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


@dataclasses.dataclass
class DecoderConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # {"rope_type": "llama3" | "linear", ...}; None = plain RoPE
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # llama/qwen3: bias on q, k, v and o (qwen2 always has q/k/v bias)
    mlp_bias: bool = False  # llama only
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    # the weights' dtype name ("bfloat16"), as config.json records it; informational, not part of equality
    dtype: str | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type={self.model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // max(self.num_attention_heads, 1)
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"DecoderConfig.{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta!r}")
        if self.mlp_bias and self.model_type != "llama":
            raise ValueError(f"mlp_bias=True exists only for model_type 'llama', not {self.model_type!r}")
        self.rope_scaling = _check_rope_scaling(self.rope_scaling)

    @property
    def qkv_bias(self) -> bool:
        return self.model_type == "qwen2" or self.attention_bias

    @property
    def o_bias(self) -> bool:
        return self.attention_bias and self.model_type != "qwen2"

    @property
    def qk_norm(self) -> bool:
        return self.model_type == "qwen3"

    @classmethod
    def from_hf(cls, hf_config: Any) -> DecoderConfig:
        """From a transformers PretrainedConfig or a config.json dict of the llama/qwen2/qwen3 families."""
        raw = hf_config.to_dict() if hasattr(hf_config, "to_dict") else hf_config
        if not isinstance(raw, Mapping):
            raise TypeError(f"hf_config must be a transformers config or a dict, got {type(hf_config).__name__}")
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type={model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        return cls._from_normalized(_normalize_with_transformers(dict(raw)))

    @classmethod
    def _from_normalized(cls, d: dict[str, Any]) -> DecoderConfig:
        model_type = d["model_type"]
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act={d['hidden_act']!r} is not supported (only 'silu', i.e. SwiGLU)")
        layer_types = d.get("layer_types") or []
        sliding = bool(d.get("use_sliding_window")) and d.get("sliding_window") is not None
        if sliding or any(t != "full_attention" for t in layer_types):
            raise ValueError("sliding-window attention (use_sliding_window / layer_types) is not supported")
        theta, scaling = _read_rope(d)
        dtype = d.get("dtype") or d.get("torch_dtype")
        return cls(
            model_type=model_type,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=d["num_attention_heads"],
            num_key_value_heads=d.get("num_key_value_heads"),
            head_dim=d.get("head_dim"),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", False)) if model_type != "qwen2" else False,
            mlp_bias=bool(d.get("mlp_bias", False)),
            initializer_range=d.get("initializer_range", 0.02),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=d.get("eos_token_id"),
            pad_token_id=d.get("pad_token_id"),
            dtype=str(dtype).removeprefix("torch.") if dtype is not None else None,
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json dict that transformers 4.x and 5.x load back as this family's *ForCausalLM."""
        rope_scaling = dict(self.rope_scaling) if self.rope_scaling else None
        d: dict[str, Any] = {
            "architectures": [ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,  # 4.x style
            "rope_scaling": rope_scaling,  # 4.x style
            "rope_parameters": {**(rope_scaling or {"rope_type": "default"}), "rope_theta": self.rope_theta},
            "tie_word_embeddings": self.tie_word_embeddings,
            "initializer_range": self.initializer_range,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "attention_dropout": 0.0,
            "use_cache": True,
        }
        if self.model_type == "llama":
            d.update(attention_bias=self.attention_bias, mlp_bias=self.mlp_bias)
        elif self.model_type == "qwen3":
            d.update(attention_bias=self.attention_bias)
        if self.model_type in ("qwen2", "qwen3"):
            d.update(use_sliding_window=False, sliding_window=None, max_window_layers=self.num_hidden_layers)
        if self.dtype is not None:
            d.update(dtype=self.dtype, torch_dtype=self.dtype)
        return d


def _normalize_with_transformers(raw: dict[str, Any]) -> dict[str, Any]:
    """Let the installed transformers fill this family's defaults (e.g. qwen3 head_dim=128) and
    standardize the rope keys, exactly as it would when loading this config.json."""
    from transformers import AutoConfig

    kwargs = {k: v for k, v in raw.items() if k not in ("model_type", "transformers_version", "architectures")}
    try:
        return AutoConfig.for_model(raw["model_type"], **kwargs).to_dict()
    except (TypeError, ValueError, KeyError) as err:
        raise ValueError(f"invalid {raw['model_type']} config: {err}") from err


def _read_rope(d: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"rope_parameters must be a dict, got {params!r}")
    theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if params.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) not in (None, 1.0):
        raise ValueError("partial_rotary_factor != 1 is not supported")
    if rope_type == "default":
        return float(theta), None
    scaling = {"rope_type": rope_type}
    scaling.update({k: params[k] for k in ROPE_SCALING_KEYS.get(rope_type, ()) if k in params})
    if rope_type == "llama3" and "original_max_position_embeddings" not in scaling:
        scaling["original_max_position_embeddings"] = d.get("max_position_embeddings")
    return float(theta), scaling


def _check_rope_scaling(scaling: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not scaling:
        return None
    scaling = dict(scaling)
    rope_type = scaling.get("rope_type", scaling.pop("type", None))
    if rope_type in (None, "default"):
        return None
    if rope_type not in ROPE_SCALING_KEYS:
        raise ValueError(
            f"rope_scaling rope_type={rope_type!r} is not supported; supported: default, "
            + ", ".join(ROPE_SCALING_KEYS)
        )
    missing = [k for k in ROPE_SCALING_KEYS[rope_type] if scaling.get(k) is None]
    if missing:
        raise ValueError(f"rope_scaling of type {rope_type!r} is missing {', '.join(missing)}")
    scaling["rope_type"] = rope_type
    return scaling
