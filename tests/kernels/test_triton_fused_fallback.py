"""The single pass falls back to the two-pass path when it runs out of memory (torch.OutOfMemoryError only: any
other error surfaces), and the block size respects the device's free memory. Under the interpreter, against the
two-pass result (itself checked against fp64 in test_triton_logprob_backward.py). Every call records the path it took
(triton_backend.PATHS): a fallback is counted, never silent."""

import pytest
import torch

from seedfast.ops import LossOptions
from seedfast.ops import triton_backend as tb
from tests.kernels.kernel_cases import random_case
from tests.kernels.triton_reference import INTERPRETER

pytestmark = INTERPRETER


def _args():
    hidden, weight, targets = random_case(torch.float32, seed=7)
    n = hidden.shape[0]
    g = torch.Generator().manual_seed(3)
    per_token = dict(old_logprob=None, ref_logprob=None, teacher_logprob=None, teacher_mask=None,
                     advantages=torch.randn(n, generator=g),
                     token_weights=torch.where(targets == -100, 0.0, 1.0 / n))
    kw = dict(temperature=1.0, ignore_index=-100, with_entropy=False, per_token=per_token, options=LossOptions())
    return hidden, weight, targets, kw


def test_out_of_memory_in_the_single_pass_runs_the_two_pass_path(monkeypatch):
    hidden, weight, targets, kw = _args()
    two_pass = tb.fused_forward_backward(hidden, weight, targets, rows=0, **kw)
    tried = []

    def oom(*args):
        tried.append(True)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.25 GiB")

    monkeypatch.setattr(tb, "_fused", oom)
    tb.reset_path_counts()
    got = tb.fused_forward_backward(hidden, weight, targets, rows=16, **kw)
    assert tried
    assert tb.path_counts() == {"fused.two_pass:out_of_memory": 1, "forward": 1, "backward.two_pass": 1}
    for x, y in zip((got[0], *got[2:]), (two_pass[0], *two_pass[2:])):
        assert torch.equal(x, y)


def test_other_errors_in_the_single_pass_surface(monkeypatch):
    hidden, weight, targets, kw = _args()

    def broken(*args):
        raise RuntimeError("an illegal memory access was encountered")

    monkeypatch.setattr(tb, "_fused", broken)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        tb.fused_forward_backward(hidden, weight, targets, rows=16, **kw)


def test_row_block_fits_free_memory(monkeypatch):
    monkeypatch.delenv("SEEDFAST_TRITON_FUSED_MB", raising=False)
    n, d, vocab = 16384, 4096, 152064
    assert tb.choose_fused_rows(n, vocab, 2) == 2048  # the 2048 MiB default alone
    dw, dh = vocab * d * 4, n * d * 2
    free = int((dw + dh + 1200 * vocab * 6) / 0.9)  # room for 1200 rows after dW and dH
    # 1200 rows fit -> 1152 (whole 128-row tiles) -> 15 blocks, balanced: ceil(16384 / 15) = 1093 -> 1152 again
    assert tb.choose_fused_rows(n, vocab, 2, free, d) == 1152
    assert tb.choose_fused_rows(n, vocab, 2, dw + dh, d) == 0  # nothing left for a block: two-pass path


@pytest.mark.parametrize("case,expected", [
    (dict(rows=16), "single_pass"),  # three blocks of 16, 16 and 13 rows
    (dict(rows=None), "single_pass"),  # the default budget: one block
    (dict(rows=0), "two_pass:budget"),  # no block of FUSED_MIN_ROWS fits
    (dict(rows=16, need_hidden_grad=False, need_weight_grad=False), "two_pass:no_grad"),
])
def test_each_call_records_the_path_it_took(case, expected):
    hidden, weight, targets, kw = _args()
    tb.reset_path_counts()
    tb.fused_forward_backward(hidden, weight, targets, **case, **kw)
    counts = tb.path_counts()
    assert tb.fused_path_taken(counts) == expected
    assert counts[f"fused.{expected}"] == 1
    two_pass = expected.startswith("two_pass")
    assert counts.get("forward", 0) == int(two_pass) and counts.get("backward.two_pass", 0) == int(
        expected == "two_pass:budget")  # the fallback's own kernels; no gradients asked: no backward
    tb.fused_forward_backward(hidden, weight, targets, rows=0, **kw)
    assert tb.fused_path_taken(tb.path_counts()) == ("two_pass:budget" if expected == "two_pass:budget" else "mixed")


def test_no_call_no_path():
    tb.reset_path_counts()
    assert tb.path_counts() == {} and tb.fused_path_taken({}) is None
