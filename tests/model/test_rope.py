"""Rotary inverse frequencies against transformers' own rope init functions, and the rotation itself."""

import math

import pytest
import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from seedfast.model import DecoderConfig
from seedfast.model.layers import apply_rope, rope_cos_sin, rope_inv_freq
from tests.model.model_helpers import hf_config


@pytest.mark.parametrize("family", ["llama-untied-llama3rope", "qwen3-tied"])
def test_scaled_inv_freq_matches_transformers(family):
    config = hf_config(family)
    ref, _ = ROPE_INIT_FUNCTIONS[config.rope_parameters["rope_type"]](config, "cpu")
    ours = rope_inv_freq(DecoderConfig.from_hf(config))
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)
    plain = rope_inv_freq(DecoderConfig.from_hf(hf_config(family, rope_parameters=None)))
    assert not torch.allclose(ours, plain)  # the scaling did something


def test_default_inv_freq_is_theta_power():
    cfg = DecoderConfig.from_hf(hf_config("qwen2-tied"))  # rope_theta 1e6, head_dim 8
    expected = torch.tensor([1e6 ** (-2 * i / 8) for i in range(4)], dtype=torch.float64)
    torch.testing.assert_close(rope_inv_freq(cfg).double(), expected, rtol=1e-6, atol=0)


def test_rotation_is_a_per_pair_rotation_by_position_times_frequency():
    inv_freq = torch.tensor([1.0, 0.1])
    pos = torch.tensor([0, 3])
    cos, sin = rope_cos_sin(inv_freq, pos, torch.float64)
    x = torch.randn(2, 1, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out = apply_rope(x, cos, sin)
    for t in range(2):
        for i in range(2):  # rotate-half pairs dimension i with dimension i + 2
            a = float(pos[t]) * float(inv_freq[i])
            x1, x2 = x[t, 0, i].item(), x[t, 0, i + 2].item()
            # abs: the angles are fp32 (rope_cos_sin), so a near-cancelling pair is off by ~1e-8 of |x|
            assert out[t, 0, i].item() == pytest.approx(x1 * math.cos(a) - x2 * math.sin(a), abs=1e-6)
            assert out[t, 0, i + 2].item() == pytest.approx(x2 * math.cos(a) + x1 * math.sin(a), abs=1e-6)
