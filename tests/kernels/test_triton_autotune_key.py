"""The autotune key and the gradient scale's host sync (seedfast/kernels/autotuned.py, triton_backend._grad_scale).

Autotuners are keyed on a bucket of N (the next power of two, 128..32768): one micro-batch size does not pick the
tile for another, and token counts that change every step do not re-tune. SEEDFAST_AUTOTUNE_ONE=1 leaves one
candidate (tests, the GPU window). The scale of G needs a host sync only for fp16: bf16 and fp32 have fp32's
exponent range (a meta tensor, which has no values, proves no sync happens)."""

import math

import pytest
import torch

from seedfast.kernels import autotuned
from seedfast.ops import triton_backend as tb


def test_n_bucket():
    assert [autotuned.n_bucket(n) for n in (1, 128, 129, 1000, 1024, 1025, 16384, 20000, 10**6)] == [
        128, 128, 256, 1024, 1024, 2048, 16384, 32768, 32768]


def test_autotuner_per_n_bucket_and_the_one_candidate_switch(monkeypatch):
    monkeypatch.delenv("SEEDFAST_AUTOTUNE_ONE", raising=False)
    small, same, big = (autotuned.tuned("fwd_single", 90, n_tokens=n) for n in (900, 1024, 16384))
    assert small is same and small is not big
    assert len(big.configs) == len(autotuned.candidates("fwd_single", 90)) > 1
    monkeypatch.setenv("SEEDFAST_AUTOTUNE_ONE", "1")
    for name in ("fwd_single", "fwd_dual", "grad_logits"):
        one = autotuned.tuned(name, 90, n_tokens=16384)
        assert one is not big and len(one.configs) == 1
        assert one.configs[0].kwargs == autotuned._SPECS[name][1][90][0].kwargs  # the first, Hopper's lead tile


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_no_host_sync_for_the_scale_of_bf16_and_fp32(dtype):
    a = torch.empty(8, device="meta")
    assert tb._grad_scale(a, a, a, 1.0, dtype) == 1.0


def test_fp16_scale_ignores_ignored_rows():
    a = torch.tensor([1e-9, float("nan"), 3e-9])
    ignored = torch.tensor([False, True, False])
    scale = tb._grad_scale(a, None, None, 1.0, torch.float16, ignored)
    assert scale == 2.0 ** 28 and math.isfinite(scale)  # 3e-9·2^28 = 0.8 <= 1 < 3e-9·2^29
