"""Every autotune candidate of the divergence kernels (configs.DIVERGENCE_CONFIGS for the statistics and sums kernels,
DIVERGENCE_GRAD_CONFIGS for the recomputed G, and their fp32 lists) launched directly, each kind, against the fp64
reference, with NaN and Inf in inactive rows. On CUDA (gpu marker) at a ragged shape for the device's architecture;
on CPU under the interpreter at a small one, for sm_90's lists (the H200's), as tests/kernels/test_triton_candidates.py
does for the log-prob kernels."""

import pytest
import torch

from seedfast.kernels import configs
from seedfast.ops import triton_divergence as tb
from tests.kernels.divergence_reference import KINDS, reference_divergence
from tests.kernels.triton_reference import TOL, assert_close

CUDA = torch.cuda.is_available()
ARCH = configs.arch_key(10 * torch.cuda.get_device_capability()[0] + torch.cuda.get_device_capability()[1]) \
    if CUDA else 90
MARKS = [pytest.mark.gpu] if CUDA else []
SHAPE = (1000, 1024, 32003) if CUDA else (70, 64, 300)  # ragged against every tile; d a multiple of 16
FAMILIES = {
    "div_fwd": (configs.DIVERGENCE_CONFIGS, torch.bfloat16),
    "div_grad": (configs.DIVERGENCE_GRAD_CONFIGS, torch.bfloat16),
    "div_fwd_fp32": (configs.FP32_DIVERGENCE_CONFIGS, torch.float32),
    "div_grad_fp32": (configs.FP32_DIVERGENCE_GRAD_CONFIGS, torch.float32),
}
CASES = [pytest.param(family, i, marks=MARKS, id=f"{family}-{i}")
         for family, (lists, _) in FAMILIES.items() for i in range(len(lists[ARCH]))]
BETA, TEMPERATURE = 0.4, 0.9


def _case(dtype):
    n, d, vocab = SHAPE
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, d, generator=g)
    teacher = hidden + torch.randn(n, d, generator=g)
    weight = torch.randn(vocab, d, generator=g) * 2 / d**0.5
    coef = torch.rand(n, generator=g) + 0.5
    coef[::13] = 0.0
    hidden[::13] = float("nan")
    teacher[0, 0] = float("inf")  # row 0 is inactive
    device = "cuda" if CUDA else "cpu"
    return tuple(t.to(device=device, dtype=dtype) for t in (hidden, teacher, weight)) + (coef.to(device),)


@pytest.mark.parametrize("family,index", CASES)
def test_every_divergence_candidate_against_fp64(family, index):
    lists, dtype = FAMILIES[family]
    config = lists[ARCH][index]
    hidden, teacher, weight, coef = _case(dtype)
    active = coef != 0
    rel = TOL[dtype]
    for kind in KINDS:
        ref = reference_divergence(hidden.cpu(), teacher.cpu(), weight.cpu(), coef.cpu(), kind, BETA, TEMPERATURE)
        setup = dict(kind=kind, beta=BETA, temperature=TEMPERATURE)
        fwd_config = config if family.startswith("div_fwd") else None
        value, center, lse, tlse = tb.divergence_forward(hidden, teacher, weight, active, config=fwd_config, **setup)
        keep = active.cpu()
        assert_close(value.cpu()[keep], ref["value"][keep], rel, f"{config} {kind} value")
        assert_close(center.cpu()[keep], ref["center"][keep], rel, f"{config} {kind} center")
        assert bool((value[~active] == 0).all())
        if family.startswith("div_fwd"):
            part, _ = tb.divergence_partial(hidden, teacher, weight, active, lse, tlse, config=config, **setup)
            assert_close(part.cpu()[keep], ref["value"][keep], rel, f"{config} {kind} partial")
            continue
        gh, gw = tb.divergence_backward(hidden, teacher, weight, lse, tlse, center, coef, config=config, **setup)
        assert bool((gh[~active] == 0).all()) and bool(torch.isfinite(gw.float()).all())
        assert_close(gh.cpu(), ref["grad_hidden"], rel, f"{config} {kind} grad_hidden")
        assert_close(gw.cpu(), ref["grad_weight"], rel, f"{config} {kind} grad_weight")


def test_every_divergence_candidate_is_a_case():
    counts = {family: len(lists[ARCH]) for family, (lists, _) in FAMILIES.items()}
    assert len(CASES) == sum(counts.values()) and counts["div_fwd"] >= 2 and counts["div_grad"] >= 2
