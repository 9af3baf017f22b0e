"""Bad input to the public ops: one ValueError (TypeError for a non-tensor) naming the offender."""

import pytest
import torch

from seedfast.ops import LossOptions, fused_loss, linear_logprob
from tests.ops.ops_reference import random_problem

N, D, V = 6, 4, 11


def problem():
    hidden, weight, targets = random_problem(N, D, V)
    return {"hidden": hidden, "weight": weight, "targets": targets}


def loss_kwargs():
    return {"token_weights": torch.full((N,), 1.0 / N), "advantages": torch.randn(N), "old_logprob": -torch.rand(N)}


LINEAR_CASES = [
    ({"hidden": torch.randn(N)}, "hidden"),
    ({"hidden": torch.ones(N, D, dtype=torch.int64)}, "hidden"),
    ({"weight": torch.randn(V, D + 1)}, "weight"),
    ({"weight": torch.randn(0, D)}, "weight"),
    ({"targets": torch.zeros(N)}, "targets"),
    ({"targets": torch.zeros(N + 1, dtype=torch.int64)}, "targets"),
    ({"targets": torch.tensor([0, 1, 2, V, 3, 4])}, r"targets\[3\] = 11"),
    ({"targets": torch.tensor([0, 1, -1, 2, 3, 4])}, r"targets\[2\] = -1"),
    ({"teacher_hidden": torch.randn(N, D + 1)}, "teacher_hidden"),
    ({"temperature": 0.0}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"backend": "cuda"}, "backend"),
    ({"backend": "triton"}, "triton"),  # CPU tensors without TRITON_INTERPRET=1
]


@pytest.mark.parametrize("change, name", LINEAR_CASES)
def test_linear_logprob_rejects(change, name, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    args = {**problem(), **change}
    with pytest.raises(ValueError, match=name):
        linear_logprob(**args)


def test_non_tensor_is_a_type_error():
    with pytest.raises(TypeError, match="hidden"):
        linear_logprob([[0.0] * D] * N, problem()["weight"], problem()["targets"])


LOSS_CASES = [
    ({"options": LossOptions(gate="hard")}, "gate"),
    ({"options": LossOptions(kl_kind="k4")}, "kl_kind"),
    ({"backend": "jax"}, "backend"),
    ({"options": LossOptions(kl_coef=0.1)}, "ref_logprob"),
    ({"options": LossOptions(opd_coef=0.1)}, "teacher_logprob"),
    ({"advantages": torch.randn(N, 1)}, "advantages"),
    ({"old_logprob": torch.randn(N + 2)}, "old_logprob"),
    ({"token_weights": torch.ones(N, dtype=torch.int64)}, "token_weights"),
    ({"ref_logprob": torch.randn(2, N)}, "ref_logprob"),
    ({"teacher_logprob": torch.randn(N - 1)}, "teacher_logprob"),
    ({"teacher_mask": torch.ones(N + 1, dtype=torch.bool)}, "teacher_mask"),
    ({"options": LossOptions(clip_low=1.0)}, "clip_low"),
    ({"options": LossOptions(clip_high=-0.1)}, "clip_high"),
    ({"options": LossOptions(dual_clip=1.0)}, "dual_clip"),
    ({"options": LossOptions(opd_beta=float("inf"))}, "opd_beta"),
]


@pytest.mark.parametrize("change, name", LOSS_CASES)
def test_fused_loss_rejects(change, name):
    with pytest.raises(ValueError, match=name):
        fused_loss(**problem(), **{**loss_kwargs(), **change})


def test_fused_loss_options_must_be_loss_options():
    with pytest.raises(TypeError, match="options must be a seedfast.algo.losses.LossOptions"):
        fused_loss(**problem(), **loss_kwargs(), options={"clip_low": 0.2})


def test_unknown_backend_in_environment(monkeypatch):
    monkeypatch.setenv("SEEDFAST_OPS_BACKEND", "cuda")
    with pytest.raises(ValueError, match="SEEDFAST_OPS_BACKEND"):
        linear_logprob(**problem())
