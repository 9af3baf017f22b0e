"""DecoderConfig from HF configs (5.x and 4.x style), back to config.json, and its errors."""

import json

import pytest
import transformers

from seedfast.model import DecoderConfig
from tests.model.model_helpers import FAMILIES, LLAMA3_ROPE, TINY, hf_config


@pytest.mark.parametrize("family", list(FAMILIES))
def test_from_hf_and_back_through_autoconfig(family, tmp_path):
    config = hf_config(family)
    ours = DecoderConfig.from_hf(config)
    assert ours.model_type == config.model_type
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    assert (ours.num_attention_heads, ours.num_key_value_heads, ours.head_dim) == (
        config.num_attention_heads, config.num_key_value_heads, head_dim)
    assert ours.tie_word_embeddings == config.tie_word_embeddings
    (tmp_path / "config.json").write_text(json.dumps(ours.to_hf_dict()))
    back = transformers.AutoConfig.from_pretrained(tmp_path)
    assert type(back) is type(config)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "rms_norm_eps", "tie_word_embeddings", "rope_parameters"):
        assert getattr(back, key) == getattr(config, key), key
    assert DecoderConfig.from_hf(back) == ours
    assert DecoderConfig.from_hf(json.loads((tmp_path / "config.json").read_text())) == ours


def test_family_features():
    llama = DecoderConfig.from_hf(hf_config("llama-tied-bias"))
    qwen2 = DecoderConfig.from_hf(hf_config("qwen2-untied"))
    qwen3 = DecoderConfig.from_hf(hf_config("qwen3-untied"))
    assert (llama.qkv_bias, llama.o_bias, llama.mlp_bias, llama.qk_norm) == (True, True, True, False)
    assert (qwen2.qkv_bias, qwen2.o_bias, qwen2.qk_norm) == (True, False, False)
    assert (qwen3.qkv_bias, qwen3.o_bias, qwen3.qk_norm) == (False, False, True)


def test_transformers4_style_dict_reads_like_5x():
    v5 = DecoderConfig.from_hf({"model_type": "llama", **TINY, "rope_parameters": LLAMA3_ROPE})
    scaling = {k: v for k, v in LLAMA3_ROPE.items() if k not in ("rope_theta", "rope_type")}
    v4 = DecoderConfig.from_hf({"model_type": "llama", **TINY, "rope_theta": LLAMA3_ROPE["rope_theta"],
                                "rope_scaling": {"type": "llama3", **scaling}})
    assert v4 == v5
    assert v5.rope_theta == 500000.0 and v5.rope_scaling["rope_type"] == "llama3"
    d = v5.to_hf_dict()  # both styles are written
    assert d["rope_theta"] == 500000.0 and d["rope_scaling"]["factor"] == 8.0
    assert d["rope_parameters"]["rope_theta"] == 500000.0


def test_family_defaults_come_from_transformers():
    minimal = {"vocab_size": 10, "hidden_size": 64, "intermediate_size": 8, "num_hidden_layers": 1,
               "num_attention_heads": 2, "num_key_value_heads": 1}
    assert DecoderConfig.from_hf({"model_type": "qwen3", **minimal}).head_dim == 128  # Qwen3's own default
    assert DecoderConfig.from_hf({"model_type": "qwen2", **minimal}).head_dim == 32  # hidden_size / heads
    assert DecoderConfig.from_hf({"model_type": "qwen2", **minimal}).rope_theta == transformers.Qwen2Config(
        **minimal).rope_parameters["rope_theta"]


@pytest.mark.parametrize(
    "change, match",
    [
        ({"model_type": "mistral"}, "model_type='mistral' is not supported"),
        ({"model_type": None}, "model_type=None is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}}, "rope_type='yarn'"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads=3"),
    ],
)
def test_bad_configs_get_one_clear_error(change, match):
    with pytest.raises(ValueError, match=match):
        DecoderConfig.from_hf({"model_type": "llama", **TINY, **change})


def test_sliding_window_is_refused():
    with pytest.raises(ValueError, match="sliding-window"):
        DecoderConfig.from_hf(hf_config("qwen2-untied", use_sliding_window=True, sliding_window=8,
                                        max_window_layers=0))


def test_direct_construction_validates():
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        DecoderConfig("gpt2", 10, 8, 8, 1, 2)
    with pytest.raises(ValueError, match="hidden_size must be a positive int"):
        DecoderConfig("llama", 10, 0, 8, 1, 2)
    with pytest.raises(ValueError, match="missing low_freq_factor"):
        DecoderConfig("llama", 10, 8, 8, 1, 2, rope_scaling={"rope_type": "llama3", "factor": 8.0})
