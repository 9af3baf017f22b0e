"""The CPU benchmark compares like with like: its naive and fused variants compute the same values and
gradients, and its memory probe sees what the process allocates."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import logprob_cpu  # noqa: E402
from _common import PeakRSS  # noqa: E402


@pytest.mark.parametrize("kind", ["logprob", "loss_grpo", "loss_seed"])
def test_naive_and_ours_agree(kind):
    x = logprob_cpu.make_inputs(64, 16, 300)
    results = []
    for variant in (f"naive_{kind}", f"ours_{kind}"):
        value = logprob_cpu.make_forward(variant, x)()
        results.append((value.detach(), *torch.autograd.grad(value, (x["hidden"], x["weight"]))))
    for naive, ours in zip(*results):
        torch.testing.assert_close(ours, naive, rtol=1e-4, atol=1e-6)


def test_peak_rss_sees_an_allocation():
    with PeakRSS() as probe:
        block = torch.ones(8 << 20)  # 32 MiB, touched
        del block
    assert probe.extra_bytes >= 30 << 20
