"""Every autotune candidate (seedfast/kernels/configs.py) launched directly, not just the one the autotuner picks:
the forward (one and two contexts), the recomputed logits gradient of the backward, and the fp32 candidates, each
against fp64 references, with NaN and Inf in the hidden rows and upstream gradients of ignored targets (which must
contribute exactly 0). On CUDA (gpu marker) at a ragged shape the candidates' tiles do not divide, for the device's
architecture; on CPU under the interpreter at a small shape, for sm_90's lists (the H200's), so that a window never
meets a candidate this test has not run."""

import pytest
import torch

from seedfast.kernels import configs
from seedfast.ops import triton_backend as tb
from tests.kernels.triton_reference import TOL, assert_close, reference_grads, reference_logprob

CUDA = torch.cuda.is_available()
ARCH = configs.arch_key(10 * torch.cuda.get_device_capability()[0] + torch.cuda.get_device_capability()[1]) \
    if CUDA else 90
MARKS = [pytest.mark.gpu] if CUDA else []
# (N, d, V): ragged in every dimension against 64-, 128- and 256-wide tiles (d a multiple of 16: the kernels' hint)
SHAPE = (1000, 1024, 32003) if CUDA else (70, 64, 300)
FAMILIES = {
    "fwd_single": (configs.FWD_CONFIGS, torch.bfloat16),
    "fwd_dual": (configs.FWD_DUAL_CONFIGS, torch.bfloat16),
    "grad_logits": (configs.GRAD_LOGITS_CONFIGS, torch.bfloat16),
    "fwd_fp32": (configs.FP32_CONFIGS["fwd"], torch.float32),
    "grad_logits_fp32": (configs.FP32_CONFIGS["grad_logits"], torch.float32),
}
CASES = [pytest.param(family, i, marks=MARKS, id=f"{family}-{i}")
         for family, (lists, _) in FAMILIES.items() for i in range(len(lists[ARCH]))]


def _case(dtype):
    n, d, vocab = SHAPE
    device = "cuda" if CUDA else "cpu"
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, d, generator=g).to(dtype)
    teacher = torch.randn(n, d, generator=g).to(dtype)
    weight = (torch.randn(vocab, d, generator=g) * 2 / d**0.5).to(dtype)
    targets = torch.randint(0, vocab, (n,), generator=g)
    ignored = torch.zeros(n, dtype=torch.bool)
    ignored[::13] = True
    targets[ignored] = -100
    clean = hidden.masked_fill(ignored[:, None], 0.0)
    poisoned = hidden.masked_fill(ignored[:, None], float("nan"))
    poisoned[0, 0] = float("inf")  # row 0 is ignored
    to = lambda *ts: [t.to(device) for t in ts]  # noqa: E731
    return (*to(poisoned, clean, teacher, weight, targets, ignored),)


@pytest.mark.parametrize("family,index", CASES)
def test_every_candidate_against_fp64(family, index):
    lists, dtype = FAMILIES[family]
    config = lists[ARCH][index]
    hidden, clean, teacher, weight, targets, ignored = _case(dtype)
    rel = TOL[dtype]
    temperature = 0.9
    keep = ~ignored
    if family.startswith("fwd"):
        dual = family == "fwd_dual"
        logprob, entropy, teacher_lp, _ = tb.forward(hidden, weight, targets, teacher if dual else None, temperature,
                                                     True, -100, config=config)
        ref_lp, ref_ent, ref_teacher, _ = reference_logprob(clean, weight, targets, teacher if dual else None,
                                                            temperature)
        assert_close(logprob[keep], ref_lp[keep], rel, f"{config} logprob")
        assert_close(entropy[keep], ref_ent[keep], rel, f"{config} entropy")
        assert bool((logprob[ignored] == 0).all())
        if dual:
            assert_close(teacher_lp[keep], ref_teacher[keep], rel, f"{config} teacher_logprob")
        return
    # the backward: statistics from the default forward, then this candidate's recomputed G
    _, entropy, _, lse = tb.forward(hidden, weight, targets, None, temperature, True, -100)
    g = torch.Generator().manual_seed(1)
    a = torch.randn(SHAPE[0], generator=g).to(hidden.device).masked_fill(ignored, float("nan"))
    b = torch.randn(SHAPE[0], generator=g).to(hidden.device).masked_fill(ignored, float("inf"))
    gh, gw = tb.backward(hidden, weight, targets, lse, entropy, a, b, temperature, -100, config=config)
    assert bool(torch.isfinite(gh.float()).all()) and bool(torch.isfinite(gw.float()).all())
    assert bool((gh[ignored] == 0).all())
    ref_gh, ref_gw = reference_grads(clean, weight, targets, a.masked_fill(ignored, 0.0), b.masked_fill(ignored, 0.0),
                                     temperature)
    assert_close(gh, ref_gh, rel, f"{config} grad_hidden")
    assert_close(gw, ref_gw, rel, f"{config} grad_weight")


def test_every_candidate_is_a_case():
    # a candidate added to configs.py is checked here without editing this file
    counts = {family: len(lists[ARCH]) for family, (lists, _) in FAMILIES.items()}
    assert len(CASES) == sum(counts.values()) and counts["fwd_single"] >= 2 and counts["grad_logits"] >= 1
