"""The kernels that serve two contexts: linear_logprob with teacher_hidden runs the forward kernel with student and
teacher rows on the same W tiles, then the two-pass backward for the student rows (the teacher takes no
gradient). Through the public op and autograd, under the interpreter, against fp64 materialized log_softmax on
the adversarial inputs of kernel_cases.py: values of both contexts and the student's gradients."""

import pytest
import torch

from seedfast.ops import linear_logprob
from tests.kernels.kernel_cases import D, N, V, all_negative_case, huge_case, random_case
from tests.kernels.triton_reference import INTERPRETER, TOL, assert_close, reference_grads, reference_logprob

pytestmark = INTERPRETER


def _teacher_for(hidden, seed):
    """Teacher rows of the same kind as the student's (same scale and sign pattern, other values)."""
    g = torch.Generator().manual_seed(seed)
    if bool((hidden.abs() == 1).all()):  # the extreme cases: ±1 patterns, rows permuted
        return hidden[torch.randperm(hidden.shape[0], generator=g)].clone()
    return (torch.randn(hidden.shape, generator=g) * float(hidden.float().std())).to(hidden.dtype)


CASES = {
    "odd V, bf16, T=0.7": (lambda: random_case(torch.bfloat16, seed=11), 0.7, None),
    "odd V, fp32, T=1.3": (lambda: random_case(torch.float32, seed=12), 1.3, None),
    # fp32 logits near -1000 carry ~3e-5 absolute rounding (half their ulp); in dH = Σ_v G_v·W_v it is multiplied
    # by |W_v| ~ 31 (the rows share an offset of -1000/D): ~1e-3 of the gradient's scale, fp32's limit here.
    "all-negative logits": (all_negative_case, 1.0, 1e-3),
    "logits beyond 3e3": (huge_case, 1.0, 2e-4),
}


@pytest.mark.parametrize("case", list(CASES))
def test_two_contexts_values_and_student_gradients(case):
    make, temperature, rel = CASES[case]
    hidden, weight, targets = make()
    rel = rel or TOL[hidden.dtype]
    teacher = _teacher_for(hidden, seed=13)
    g = torch.Generator().manual_seed(14)
    up_lp, up_ent = torch.randn(hidden.shape[0], generator=g), torch.randn(hidden.shape[0], generator=g)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    out = linear_logprob(h, w, targets, teacher_hidden=teacher, temperature=temperature, with_entropy=True,
                         backend="triton")
    ((out.logprob * up_lp).sum() + (out.entropy * up_ent).sum()).backward()
    ref_lp, ref_ent, ref_teacher, _ = reference_logprob(hidden, weight, targets, teacher, temperature)
    ref_gh, ref_gw = reference_grads(hidden, weight, targets, up_lp, up_ent, temperature)
    assert_close(out.logprob, ref_lp, rel, "logprob")
    assert_close(out.entropy, ref_ent, rel, "entropy")
    assert_close(out.teacher_logprob, ref_teacher, rel, "teacher_logprob")
    assert not out.teacher_logprob.requires_grad
    assert_close(h.grad, ref_gh, rel, "grad_hidden")
    assert_close(w.grad, ref_gw, rel, "grad_weight")
    ignored = targets == -100
    assert bool((out.teacher_logprob[ignored] == 0).all()) and bool((h.grad[ignored] == 0).all())


def test_two_contexts_zero_tokens():
    hidden, weight, targets = random_case(torch.float32, n=0)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    out = linear_logprob(h, w, targets, teacher_hidden=torch.zeros(0, D), with_entropy=True, backend="triton")
    assert out.logprob.shape == out.entropy.shape == out.teacher_logprob.shape == (0,)
    (out.logprob.sum() + out.entropy.sum()).backward()
    assert h.grad is None or h.grad.shape == (0, D)
    assert w.grad is None or bool((w.grad == 0).all())
    assert (N, V) != (0, 0)  # the shared case constants stay the adversarial ones
