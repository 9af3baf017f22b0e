"""Gradients that are not needed are not computed: a frozen LM head (weight.requires_grad False) costs no dW
GEMM, on the torch backend (counted in FLOPs) and the Triton one (counted in GEMM launches), and the gradients
that are computed are unchanged. The targets' range is checked once per call (one host sync), with the same
error on both backends."""

from __future__ import annotations

import importlib
import os
import sys
import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from seedfast.ops import LossOptions, chunked, fused_loss, linear_logprob, validate
from tests.ops.ops_reference import fp64_leaves, materialized_logprob, max_rel_err, random_problem

# The Triton cases run under the interpreter where no GPU exists. As in tests/kernels/conftest.py the variable
# is set at import (collection), before anything imports triton: torch._dynamo does, lazily, and triton's own
# @triton.jit helpers (tl.cdiv, ...) are made for compiling unless it is set by then. Process-wide; nothing
# compiles Triton code on such a machine anyway.
INTERPRET = not torch.cuda.is_available() and "triton" not in sys.modules
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"
N, D, V = 24, 16, 150  # small: the Triton cases run under the interpreter on CPU
NEEDS = [(True, True), (True, False), (False, True)]  # (hidden, weight) requires grad


def _problem(needs: tuple[bool, bool] = (True, True), seed: int = 0, ignored: int = 3):
    hidden, weight, targets = random_problem(N, D, V, seed=seed, scale=4.0, ignored=ignored)
    return hidden.detach().requires_grad_(needs[0]), weight.detach().requires_grad_(needs[1]), targets


def _loss_kwargs(seed: int = 0, device: torch.device | str = "cpu") -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {"token_weights": torch.full((N,), 1.0 / N, device=device),
            "advantages": torch.randn(N, generator=gen).to(device),
            "old_logprob": (-torch.rand(N, generator=gen) * 5).to(device), "options": LossOptions(entropy_coef=0.01)}


def _gemm_flops(rows: int) -> int:
    """FLOPs of one [rows, V] x [V or d] GEMM of this problem (logits, dH or dW: all 2·rows·V·d)."""
    return 2 * rows * V * D


class _MatmulFlops(TorchDispatchMode):
    """2·M·N·K of every matrix product that reaches the dispatcher, in-place addmm_ included (which
    torch.utils.flop_counter does not count)."""

    OPS = {"mm": (0, 1), "addmm": (1, 2), "addmm_": (1, 2)}

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        operands = self.OPS.get(func.overloadpacket.__name__)
        if operands is not None:
            a, b = (args[i] for i in operands)
            self.flops += 2 * a.shape[0] * a.shape[1] * b.shape[1]
        return func(*args, **(kwargs or {}))


def _flops(fn) -> int:
    with _MatmulFlops() as counter:
        fn()
    return counter.flops


# ------------------------------------------------------------------------------- torch backend, direct

@pytest.mark.parametrize("with_entropy", [False, True])
def test_chunked_backward_skips_the_unneeded_gemm(tile_config, with_entropy):
    hidden, weight, targets = _problem(ignored=0)
    _, entropy, _, lse = chunked.forward(hidden.detach(), weight.detach(), targets, None, 0.8, with_entropy, -100)
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(N, generator=gen)
    b = torch.randn(N, generator=gen) if with_entropy else None
    args = (hidden.detach(), weight.detach(), targets, lse, entropy, a, b, 0.8, -100)
    full = chunked.backward(*args)
    assert _flops(lambda: chunked.backward(*args)) == 3 * _gemm_flops(N)  # logits, dH, dW
    for need_h, need_w in NEEDS[1:]:
        flags = {"need_hidden_grad": need_h, "need_weight_grad": need_w}
        grads = chunked.backward(*args, **flags)
        assert _flops(lambda flags=flags: chunked.backward(*args, **flags)) == 2 * _gemm_flops(N)
        for need, got, ref in zip((need_h, need_w), grads, full):
            if need:
                assert torch.equal(got, ref)  # the same arithmetic, bit for bit
            else:
                assert got is None
    assert chunked.backward(*args, need_hidden_grad=False, need_weight_grad=False) == (None, None)
    assert _flops(lambda: chunked.backward(*args, need_hidden_grad=False, need_weight_grad=False)) == 0


# ------------------------------------------------------------------------------- public ops, torch backend

@pytest.mark.parametrize("needs", NEEDS)
def test_linear_logprob_gradients_and_gemms(tile_config, needs):
    hidden, weight, targets = _problem(needs)
    valid = int((targets != -100).sum())
    upstream = torch.randn(N, generator=torch.Generator().manual_seed(2))
    out = linear_logprob(hidden, weight, targets, temperature=0.8, with_entropy=True)
    scalar = (out.logprob * upstream).sum() + out.entropy.sum()
    backward_flops = _flops(scalar.backward)
    assert backward_flops == (3 if all(needs) else 2) * _gemm_flops(valid)

    h64, w64 = fp64_leaves(hidden, weight)
    lp64, ent64 = materialized_logprob(h64, w64, targets, 0.8)
    ((lp64 * upstream.double()).sum() + ent64.sum()).backward()
    for leaf, ref in ((hidden, h64.grad), (weight, w64.grad)):
        if leaf.requires_grad:
            assert max_rel_err(leaf.grad, ref) < 1e-5
        else:
            assert leaf.grad is None


@pytest.mark.parametrize("needs", NEEDS[1:])
def test_linear_logprob_calls_the_backend_with_the_flags(monkeypatch, needs):
    calls, original = [], chunked.backward

    def backward(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(chunked, "backward", backward)  # the op looks the backend's functions up at call time
    hidden, weight, targets = _problem(needs)
    linear_logprob(hidden, weight, targets).logprob.sum().backward()
    assert calls == [{"need_hidden_grad": needs[0], "need_weight_grad": needs[1]}]


@pytest.mark.parametrize("path", ["fused", "three-step"])
@pytest.mark.parametrize("needs", NEEDS[1:])
def test_fused_loss_gradients_and_gemms(monkeypatch, path, needs):
    if path == "three-step":  # a block of whole vocabulary rows does not fit: forward -> token_loss -> backward
        monkeypatch.setattr(chunked, "fused_rows", lambda *args: 0)
    gemms = 3 if path == "fused" else 4  # one of them is dW
    results = {}
    for case in ((True, True), needs):
        hidden, weight, targets = _problem(case, seed=3)
        valid = int((targets != -100).sum())
        holder = {}

        def run(hidden=hidden, weight=weight, targets=targets, holder=holder):
            holder["loss"], _ = fused_loss(hidden, weight, targets, **_loss_kwargs(), temperature=0.9)

        flops = _flops(run)  # fused_loss computes its gradients in the forward call
        assert flops == (gemms if case == (True, True) else gemms - 1) * _gemm_flops(valid)
        (2.0 * holder["loss"]).backward()
        results[case] = (holder["loss"].detach(), hidden.grad, weight.grad)
    full, frozen = results[(True, True)], results[needs]
    assert torch.equal(frozen[0], full[0])
    for need, got, ref in zip(needs, frozen[1:], full[1:]):
        assert torch.equal(got, ref) if need else got is None


def test_fused_loss_passes_the_flags_to_the_single_pass(monkeypatch):
    calls, original = [], chunked.fused_forward_backward

    def fused_forward_backward(*args, **kwargs):
        calls.append({k: kwargs[k] for k in ("need_hidden_grad", "need_weight_grad")})
        return original(*args, **kwargs)

    monkeypatch.setattr(chunked, "fused_forward_backward", fused_forward_backward)
    hidden, weight, targets = _problem((True, False))
    fused_loss(hidden, weight, targets, **_loss_kwargs())[0].backward()
    assert calls == [{"need_hidden_grad": True, "need_weight_grad": False}]
    assert weight.grad is None and hidden.grad is not None


# ------------------------------------------------------------------------------- the target-range check

BAD_TARGETS = [(7, V, r"targets\[7\] = 150 is outside the vocabulary \[0, 150\)"),
               (2, -1, r"targets\[2\] = -1 is outside the vocabulary \[0, 150\)")]


def _count_range_checks(monkeypatch, modules) -> list:
    calls = []
    original = validate.check_target_range

    def counted(*args):
        calls.append(args[0])
        return original(*args)

    for module in modules:
        monkeypatch.setattr(module, "check_target_range", counted)
    return calls


def test_torch_path_checks_the_targets_once(monkeypatch):
    calls = _count_range_checks(monkeypatch, (validate, chunked))
    hidden, weight, targets = _problem()
    linear_logprob(hidden, weight, targets).logprob.sum().backward()
    fused_loss(hidden, weight, targets, **_loss_kwargs())[0].backward()
    with torch.no_grad():
        linear_logprob(hidden, weight, targets)
        fused_loss(hidden, weight, targets, **_loss_kwargs())
    assert calls == ["linear_logprob", "fused_loss"] * 2


@pytest.mark.parametrize("row, value, message", BAD_TARGETS)
def test_torch_path_bad_targets(row, value, message):
    hidden, weight, targets = _problem()
    targets[row] = value
    with pytest.raises(ValueError, match="linear_logprob: " + message):
        linear_logprob(hidden, weight, targets, backend="torch")
    with pytest.raises(ValueError, match="fused_loss: " + message):
        fused_loss(hidden, weight, targets, **_loss_kwargs(), backend="torch")
    with pytest.raises(ValueError, match="forward: " + message):  # the backend called directly checks too
        chunked.forward(hidden.detach(), weight.detach(), targets, None, 1.0, False, -100)


# ------------------------------------------------------------------------------- Triton backend

@pytest.fixture(scope="module")
def triton_backend() -> types.ModuleType:
    """seedfast.ops.triton_backend on CUDA, else with its kernels under the interpreter (as tests/kernels/
    conftest.py does it: the variable must be set before the @triton.jit decorators run)."""
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set (tests/kernels covers it)")
    pytest.importorskip("triton")
    if INTERPRET:  # kernels created before the variable was set (none, usually): re-create them interpreted
        stale = sorted(name for name in sys.modules if name.startswith("seedfast.kernels."))
        for name in sorted(stale, key=lambda n: n.endswith(".autotuned")):  # autotuned wraps the others: last
            importlib.reload(sys.modules[name])
    return importlib.import_module("seedfast.ops.triton_backend")


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def gemm_launches(monkeypatch, triton_backend) -> list:
    """The names of the backward GEMMs launched ("matmul_dw", "matmul_dh")."""
    launched = []
    original = triton_backend._matmul

    def counted(*args):
        launched.append(args[-1])
        return original(*args)

    monkeypatch.setattr(triton_backend, "_matmul", counted)
    return launched


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter evaluates masked-out lanes too
def test_triton_backward_skips_the_unneeded_gemm(triton_backend, gemm_launches, device):
    hidden, weight, targets = (t.detach().to(device) for t in _problem())
    tb = triton_backend
    _, entropy, _, lse = tb.forward(hidden, weight, targets, None, 0.8, True, -100)
    gen = torch.Generator().manual_seed(4)
    a, b = torch.randn(N, generator=gen).to(device), torch.randn(N, generator=gen).to(device)
    args = (hidden, weight, targets, lse, entropy, a, b, 0.8, -100)
    chunk = 64  # 3 vocabulary chunks, the last one ragged
    full = tb.backward(*args, chunk=chunk)
    assert sorted(gemm_launches) == ["matmul_dh"] * 3 + ["matmul_dw"] * 3
    for need_h, need_w in NEEDS[1:]:
        gemm_launches.clear()
        grads = tb.backward(*args, chunk=chunk, need_hidden_grad=need_h, need_weight_grad=need_w)
        assert gemm_launches == ["matmul_dh" if need_h else "matmul_dw"] * 3
        for need, got, ref in zip((need_h, need_w), grads, full):
            assert torch.equal(got, ref) if need else got is None
    gemm_launches.clear()
    assert tb.backward(*args, need_hidden_grad=False, need_weight_grad=False) == (None, None)
    assert gemm_launches == []


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("op", ["linear_logprob", "fused_loss"])
def test_triton_frozen_head_through_the_public_ops(triton_backend, gemm_launches, device, op):
    """The frozen-head gradient of hidden agrees with the torch backend's; no dW GEMM is launched."""
    grads = {}
    for backend in ("torch", "triton"):
        hidden, weight, targets = _problem((True, False), seed=5)
        hidden = hidden.detach().to(device).requires_grad_()
        weight, targets = weight.detach().to(device), targets.to(device)
        if op == "linear_logprob":
            out = linear_logprob(hidden, weight, targets, with_entropy=True, backend=backend)
            scalar = out.logprob.sum() + 0.1 * out.entropy.sum()
        else:
            scalar, _ = fused_loss(hidden, weight, targets, **_loss_kwargs(device=device), backend=backend)
        scalar.backward()
        grads[backend] = hidden.grad
    assert gemm_launches and "matmul_dw" not in gemm_launches
    assert max_rel_err(grads["triton"].cpu(), grads["torch"].cpu()) < 1e-5


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_triton_path_checks_the_targets_once(monkeypatch, triton_backend, device):
    calls = _count_range_checks(monkeypatch, (validate, chunked, triton_backend))
    hidden, weight, targets = (t.to(device) for t in _problem())
    hidden = hidden.detach().requires_grad_()
    linear_logprob(hidden, weight, targets, backend="triton").logprob.sum().backward()
    fused_loss(hidden, weight, targets, **_loss_kwargs(device=device), backend="triton")[0].backward()
    assert calls == ["linear_logprob", "fused_loss"]


@pytest.mark.parametrize("row, value, message", BAD_TARGETS)
def test_triton_path_bad_targets(triton_backend, device, row, value, message):
    hidden, weight, targets = (t.detach().to(device) for t in _problem())
    targets[row] = value
    with pytest.raises(ValueError, match="linear_logprob: " + message):
        linear_logprob(hidden, weight, targets, backend="triton")
    with pytest.raises(ValueError, match="fused_loss: " + message):
        fused_loss(hidden, weight, targets, **_loss_kwargs(device=device), backend="triton")
    with pytest.raises(ValueError, match="forward: " + message):  # the backend called directly checks too
        triton_backend.forward(hidden, weight, targets, None, 1.0, False, -100)
