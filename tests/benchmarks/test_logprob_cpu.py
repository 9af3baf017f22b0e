"""The CPU benchmark compares like with like: its naive and fused variants compute the same values and
gradients, and its memory probe sees what the process allocates. Its one results file holds a run per thread
count; a run replaces its own."""

import contextlib
import json

import pytest
import torch

from benchmarks import logprob_cpu
from benchmarks.common import PeakRSS


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


@pytest.mark.parametrize("kind", ["logprob", "loss_grpo"])
def test_frozen_head_variants_agree_and_differ_only_in_dw(kind, monkeypatch):
    """*_frozen and *_frozen_before give the same hidden gradient and no weight gradient; only _before has the
    backend compute dW (as every version before need_weight_grad did)."""
    from seedfast.ops import chunked

    asked = []
    for name in ("backward", "fused_forward_backward"):
        original = getattr(chunked, name)

        def spy(*args, original=original, **kwargs):
            asked.append(kwargs["need_weight_grad"])
            return original(*args, **kwargs)

        monkeypatch.setattr(chunked, name, spy)
    grads = {}
    for variant in (f"ours_{kind}_frozen", f"ours_{kind}_frozen_before"):
        x = logprob_cpu.make_inputs(64, 16, 300)
        asked.clear()
        with logprob_cpu.dw_always() if variant.endswith("_before") else contextlib.nullcontext():
            logprob_cpu.make_forward(variant, x)().backward()
        assert asked == [variant.endswith("_before")]
        assert x["weight"].grad is None
        grads[variant] = x["hidden"].grad
    torch.testing.assert_close(*grads.values(), rtol=0, atol=0)


def test_a_run_replaces_only_its_own_thread_count(tmp_path):
    path = tmp_path / "logprob_cpu.json"
    assert logprob_cpu.run_key(2, False) == "2" and logprob_cpu.run_key(1, True) == "1_frozen"
    logprob_cpu.save({"results": ["two threads"]}, "2", path)
    logprob_cpu.save({"results": ["one thread"]}, "1", path)
    logprob_cpu.save({"results": ["two threads, again"]}, "2", path)
    text = path.read_text()
    assert json.loads(text) == {"benchmark": "logprob_cpu", "runs": {"2": {"results": ["two threads, again"]},
                                                                     "1": {"results": ["one thread"]}}}
    assert text.endswith("}\n")
