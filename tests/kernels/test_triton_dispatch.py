"""The public ops with backend="triton" (interpreter on CPU) agree with the torch backend: the triton backend
honours the backend protocol of seedfast.ops (autograd through linear_logprob, fused_loss's three steps)."""

import pytest
import torch

from seedfast.ops import LossOptions, fused_loss, get_backend, linear_logprob
from seedfast.ops import triton_backend as tb
from tests.kernels.triton_reference import INTERPRETER, assert_close

pytestmark = INTERPRETER
N, D, V = 40, 24, 150


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, D, generator=g)
    weight = torch.randn(V, D, generator=g) / D**0.5 * 2
    targets = torch.randint(0, V, (N,), generator=g)
    targets[[2, 30]] = -100
    return hidden, weight, targets, g


def test_dispatch_selects_the_triton_backend_when_asked():
    assert get_backend("triton", torch.device("cpu")) is tb


def test_linear_logprob_autograd_matches_torch_backend():
    hidden, weight, targets, g = _inputs()
    teacher = torch.randn(N, D, generator=g)
    up_lp, up_ent = torch.randn(N, generator=g), torch.randn(N, generator=g)
    results = {}
    for backend in ("torch", "triton"):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        out = linear_logprob(h, w, targets, teacher_hidden=teacher, temperature=0.9, with_entropy=True,
                             backend=backend)
        ((out.logprob * up_lp).sum() + (out.entropy * up_ent).sum()).backward()
        results[backend] = (out.logprob, out.entropy, out.teacher_logprob, h.grad, w.grad)
    for name, ours, ref in zip(("logprob", "entropy", "teacher", "grad_hidden", "grad_weight"),
                               results["triton"], results["torch"]):
        assert_close(ours.detach(), ref.detach().double(), 1e-5, name)


@pytest.mark.parametrize("gate", ["gap", "soft_or"])
def test_fused_loss_matches_torch_backend(gate):
    hidden, weight, targets, g = _inputs(1)
    with torch.no_grad():
        lp = linear_logprob(hidden, weight, targets, backend="torch").logprob
    per_token = dict(token_weights=torch.full((N,), 1.0 / N), advantages=torch.randn(N, generator=g),
                     old_logprob=lp + 0.3 * torch.randn(N, generator=g),
                     ref_logprob=lp + 0.3 * torch.randn(N, generator=g),
                     teacher_logprob=lp + torch.randn(N, generator=g), teacher_mask=torch.rand(N, generator=g) > 0.2)
    options = dict(options=LossOptions(kl_coef=0.05, entropy_coef=0.01, opd_coef=0.1, gate=gate), temperature=1.1)
    results = {}
    for backend in ("torch", "triton"):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss, metrics = fused_loss(h, w, targets, **per_token, **options, backend=backend)
        loss.backward()
        results[backend] = (loss, metrics, h.grad, w.grad)
    ours, ref = results["triton"], results["torch"]
    assert_close(ours[0].detach(), ref[0].detach().double(), 1e-5, "loss")
    assert set(ours[1]) == set(ref[1])
    for key in ref[1]:
        assert_close(ours[1][key], ref[1][key].double(), 1e-5, key)
    assert_close(ours[2], ref[2].double(), 1e-5, "grad_hidden")
    assert_close(ours[3], ref[3].double(), 1e-5, "grad_weight")
