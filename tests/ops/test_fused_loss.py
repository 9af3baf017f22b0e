"""fused_loss against the composition linear_logprob → seedfast.algo.losses.total_loss (values, gradients
w.r.t. hidden and weight, metrics), for every aggregation mode, gate and KL kind, with and without dual
clip, with a teacher mask, on each of the torch backend's paths."""

import dataclasses
import importlib
import itertools
import types

import pytest
import torch

from seedfast.algo import losses
from seedfast.ops import LossOptions, chunked, fused_loss, linear_logprob, tiles
from tests.ops.ops_reference import max_rel_err, random_problem

B, T, D, V = 3, 13, 16, 101
N = B * T
COEFS = {"kl_coef": 0.1, "entropy_coef": 0.05, "opd_coef": 0.5}


@pytest.fixture(params=["single-pass", "single-pass-blocks", "three-step"])
def loss_path(request, monkeypatch):
    if request.param == "single-pass":
        monkeypatch.delenv(tiles.TILE_BYTES_ENV, raising=False)
    elif request.param == "single-pass-blocks":  # whole-vocabulary blocks of 8 rows
        monkeypatch.setattr(tiles, "FUSED_MIN_ROWS", 4)
        monkeypatch.setenv(tiles.TILE_BYTES_ENV, str(8 * V * 4))
    else:  # too small a budget for whole rows: forward → token_loss → backward, in 16 × 32 tiles
        monkeypatch.setenv(tiles.TILE_BYTES_ENV, "2048")
    return request.param


def make_batch(seed=0):
    hidden, weight, targets = random_problem(N, D, V, seed=seed, scale=3.0)
    gen = torch.Generator().manual_seed(seed + 100)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[:, :3] = False          # prompt tokens: real targets, weight 0
    mask[2, 9:] = False          # padding: ignored targets
    targets.view(B, T)[2, 9:] = -100
    with torch.no_grad():
        lp = linear_logprob(hidden, weight, targets).logprob
    batch = {
        "mask": mask,
        "old_logprob": lp + 0.4 * torch.randn(N, generator=gen),  # ratios on both sides of the clip range
        "ref_logprob": lp + 0.3 * torch.randn(N, generator=gen),
        "teacher_logprob": lp + torch.randn(N, generator=gen),
        "advantages": torch.tensor([0.9, -1.2, -0.5]),
        "teacher_mask": torch.tensor([True, False, True]),  # sample 1's skill failed to parse
    }
    return hidden, weight, targets, batch


def split_options(options: dict) -> tuple[LossOptions, dict]:
    """A test's keywords as (the loss options, the call's other keywords: temperature, return_logprob)."""
    names = {f.name for f in dataclasses.fields(LossOptions)}
    return (LossOptions(**{k: v for k, v in options.items() if k in names}),
            {k: v for k, v in options.items() if k not in names})


def reference(hidden, weight, targets, batch, agg, **options):
    """The loss through linear_logprob's autograd and the algo reference math."""
    loss_options, rest = split_options(options)
    out = linear_logprob(hidden, weight, targets, with_entropy=True, temperature=rest.get("temperature", 1.0))
    loss, metrics = losses.total_loss(
        out.logprob.view(B, T), batch["old_logprob"].view(B, T), batch["advantages"], batch["mask"],
        entropy=out.entropy.view(B, T), ref_logprob=batch["ref_logprob"].view(B, T),
        teacher_logprob=batch["teacher_logprob"].view(B, T), teacher_mask=batch["teacher_mask"], agg=agg,
        options=loss_options)
    return loss, metrics


def fused(hidden, weight, targets, batch, agg, **options):
    loss_options, rest = split_options(options)
    return fused_loss(
        hidden, weight, targets,
        token_weights=losses.aggregation_weights(batch["mask"], agg).flatten(),
        advantages=batch["advantages"][:, None].expand(B, T).flatten(),
        old_logprob=batch["old_logprob"], ref_logprob=batch["ref_logprob"],
        teacher_logprob=batch["teacher_logprob"],
        teacher_mask=batch["teacher_mask"][:, None].expand(B, T).flatten(), options=loss_options, **rest)


def assert_same_loss_and_grads(hidden, weight, targets, batch, agg, **options):
    ref_loss, ref_metrics = reference(hidden, weight, targets, batch, agg, **dict(options))
    ref_grads = torch.autograd.grad(ref_loss, (hidden, weight))
    loss, metrics = fused(hidden, weight, targets, batch, agg, **options)
    grads = torch.autograd.grad(loss, (hidden, weight))
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for got, ref in zip(grads, ref_grads):
        assert got.dtype == torch.float32
        assert max_rel_err(got, ref) < 2e-5
    return metrics, ref_metrics


@pytest.mark.parametrize("agg, gate, kl_kind, dual_clip",
                         list(itertools.product(losses.AGG_MODES, losses.GATES, ("low_var_kl", "k1", "k2"),
                                                (3.0, None))))
def test_matches_linear_logprob_plus_algo_losses(loss_path, agg, gate, kl_kind, dual_clip):
    hidden, weight, targets, batch = make_batch()
    metrics, ref_metrics = assert_same_loss_and_grads(hidden, weight, targets, batch, agg, gate=gate,
                                                      kl_kind=kl_kind, dual_clip=dual_clip, **COEFS)
    # The batch exercises the branches being compared.
    assert ref_metrics["clip_frac"] > 0 and ref_metrics["teacher_valid_frac"] < 1
    if dual_clip is not None:
        assert ref_metrics["dual_clip_frac"] > 0
    if agg == "token-mean":  # uniform weights: the weighted means are the reference's token means
        for key, ref_key in (("clip_frac", "clip_frac"), ("ratio_min", "ratio_min"), ("ratio_max", "ratio_max"),
                             ("kl", "kl"), ("entropy", "entropy"), ("gate_mean", "gate_mean"),
                             ("opd_term", "opd_term"), ("loss", "loss")):
            torch.testing.assert_close(metrics[key], ref_metrics[ref_key].float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("coefs", [{}, {"kl_coef": 0.2}, {"entropy_coef": 0.1}, {"opd_coef": 0.3},
                                   {"opd_coef": 0.3, "gate": "entropy"}, {"opd_coef": 0.3, "gate": "soft_or"},
                                   {"opd_coef": 0.3, "opd_mode": "advantage"},
                                   {"opd_coef": 0.8, "opd_mode": "advantage", "opd_adv_clip": 0.3}])
def test_each_term_alone(loss_path, coefs):
    hidden, weight, targets, batch = make_batch(seed=1)
    assert_same_loss_and_grads(hidden, weight, targets, batch, "token-mean", **coefs)


def test_temperature_and_clip_options(loss_path):
    hidden, weight, targets, batch = make_batch(seed=2)
    assert_same_loss_and_grads(hidden, weight, targets, batch, "seq-mean-token-mean", temperature=0.6,
                               clip_low=0.1, clip_high=0.28, dual_clip=2.0, opd_beta=2.0, **COEFS)


def test_grad_output_scales_and_backward_runs_once():
    hidden, weight, targets, batch = make_batch(seed=3)
    loss, _ = fused(hidden, weight, targets, batch, "token-mean", **COEFS)
    g1 = torch.autograd.grad(loss, (hidden, weight))
    loss, _ = fused(hidden, weight, targets, batch, "token-mean", **COEFS)
    (-2.5 * loss).backward(retain_graph=True)
    torch.testing.assert_close(hidden.grad, -2.5 * g1[0])
    torch.testing.assert_close(weight.grad, -2.5 * g1[1])
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


def test_no_grad_gives_the_same_loss_and_metrics():
    hidden, weight, targets, batch = make_batch(seed=4)
    loss, metrics = fused(hidden, weight, targets, batch, "token-mean", gate="soft_or", **COEFS)
    with torch.no_grad():
        loss_ng, metrics_ng = fused(hidden, weight, targets, batch, "token-mean", gate="soft_or", **COEFS)
    torch.testing.assert_close(loss_ng, loss.detach())
    assert metrics.keys() == metrics_ng.keys()
    for key in metrics:
        torch.testing.assert_close(metrics_ng[key], metrics[key])


def test_no_weighted_token_and_empty_batch(loss_path):
    hidden, weight, targets, batch = make_batch(seed=5)
    batch["mask"][:] = False
    loss, metrics = fused(hidden, weight, targets, batch, "token-mean", **COEFS)
    gh, gw = torch.autograd.grad(loss, (hidden, weight))
    assert loss == 0 and torch.all(gh == 0) and torch.all(gw == 0)
    assert all(torch.isfinite(v) for v in metrics.values()) and metrics["ratio_min"] == 1

    hidden, weight, targets = random_problem(0, D, V)
    empty = torch.zeros(0)
    loss, metrics = fused_loss(hidden, weight, targets, token_weights=empty, advantages=empty,
                               old_logprob=empty, ref_logprob=empty,
                               options=LossOptions(kl_coef=0.1, entropy_coef=0.1))
    loss.backward()
    assert loss == 0 and weight.grad.shape == (V, D) and torch.all(weight.grad == 0)
    assert all(torch.isfinite(v) for v in metrics.values())


def test_padding_values_do_not_leak():
    # NaN/-inf in per-token inputs at weight-0 positions must not reach loss or gradients.
    hidden, weight, targets, batch = make_batch(seed=6)
    dirty = {k: v.clone() for k, v in batch.items()}
    pad = ~batch["mask"].flatten()
    for key in ("old_logprob", "ref_logprob", "teacher_logprob"):
        dirty[key][pad] = float("nan") if key != "ref_logprob" else -float("inf")
    loss, _ = fused(hidden, weight, targets, batch, "token-mean", **COEFS)
    dirty_loss, _ = fused(hidden, weight, targets, dirty, "token-mean", **COEFS)
    grads = torch.autograd.grad(loss, (hidden, weight))
    dirty_grads = torch.autograd.grad(dirty_loss, (hidden, weight))
    torch.testing.assert_close(dirty_loss, loss)
    for a, b in zip(dirty_grads, grads):
        torch.testing.assert_close(a, b)


def test_generic_protocol_path_and_entropy_only_when_needed(monkeypatch):
    """A backend without fused_forward_backward (as the Triton one may be) goes forward → token_loss →
    backward; the entropy is requested only when a term uses it."""
    requested = []

    def forward(*args, **kwargs):
        requested.append(args[5])  # with_entropy
        return chunked.forward(*args, **kwargs)

    spy = types.SimpleNamespace(forward=forward, backward=chunked.backward, token_loss=chunked.token_loss)
    # The package re-exports the function fused_loss, which shadows its module's name: fetch the module.
    monkeypatch.setattr(importlib.import_module("seedfast.ops.fused_loss"), "get_backend", lambda name, device: spy)
    hidden, weight, targets, batch = make_batch(seed=7)
    for options, needs in (({}, False), ({"kl_coef": 0.1}, False), ({"opd_coef": 0.2}, False),
                           ({"opd_coef": 0.0, "gate": "entropy"}, False), ({"entropy_coef": 0.01}, True),
                           ({"opd_coef": 0.2, "gate": "soft_or"}, True)):
        requested.clear()
        assert_same_loss_and_grads(hidden, weight, targets, batch, "seq-mean-token-sum", **options)
        assert requested[-1] is needs, options


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs(loss_path, dtype):
    hidden, weight, targets, batch = make_batch(seed=8)
    hidden = hidden.detach().to(dtype).requires_grad_()
    weight = weight.detach().to(dtype).requires_grad_()
    loss, _ = fused(hidden, weight, targets, batch, "token-mean", **COEFS)
    grads = torch.autograd.grad(loss, (hidden, weight))
    h32, w32 = (t.detach().float().requires_grad_() for t in (hidden, weight))
    ref_loss, _ = reference(h32, w32, targets, batch, "token-mean", **COEFS)
    ref_grads = torch.autograd.grad(ref_loss, (h32, w32))
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    u = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    for got, ref in zip(grads, ref_grads):
        assert got.dtype == dtype
        assert torch.all((got.float() - ref).abs() <= u * ref.abs() * 1.01 + 1e-6)


def _on_policy_pair(hidden, weight, targets, batch, **options):
    """fused_loss with old_logprob=None, and with ℓold given explicitly as the detached ℓθ."""
    with torch.no_grad():
        own = linear_logprob(hidden, weight, targets, temperature=options.get("temperature", 1.0)).logprob
    implicit = dict(batch, old_logprob=None)
    explicit = dict(batch, old_logprob=own)
    return (fused(hidden, weight, targets, implicit, "token-mean", return_logprob=True, **options),
            fused(hidden, weight, targets, explicit, "token-mean", **options), own)


@pytest.mark.parametrize("options", [COEFS, {"kl_coef": 0.1, "temperature": 0.7}, {"opd_coef": 0.5, "gate": "soft_or"}])
def test_on_policy_old_logprob_none_is_the_detached_own_logprob(loss_path, options):
    hidden, weight, targets, batch = make_batch(seed=9)
    (loss, metrics, logprob), (ref_loss, ref_metrics), own = _on_policy_pair(hidden, weight, targets, batch, **options)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-7)
    for got, ref in zip(torch.autograd.grad(loss, (hidden, weight)), torch.autograd.grad(ref_loss, (hidden, weight))):
        assert max_rel_err(got, ref) < 1e-5
    assert metrics["ratio_min"] == 1 and metrics["ratio_max"] == 1 and metrics["clip_frac"] == 0
    ignored = targets == -100
    assert bool(ignored.any()) and bool((logprob[ignored] == 0).all())
    torch.testing.assert_close(logprob[~ignored], own[~ignored], rtol=1e-6, atol=1e-6)
    assert not logprob.requires_grad


def test_on_policy_through_the_generic_protocol_and_without_grad(monkeypatch):
    spy = types.SimpleNamespace(forward=chunked.forward, backward=chunked.backward, token_loss=chunked.token_loss)
    hidden, weight, targets, batch = make_batch(seed=10)
    with torch.no_grad():
        (loss_ng, _, lp_ng), (ref_ng, _), own = _on_policy_pair(hidden, weight, targets, batch, **COEFS)
    torch.testing.assert_close(loss_ng, ref_ng)
    monkeypatch.setattr(importlib.import_module("seedfast.ops.fused_loss"), "get_backend", lambda name, device: spy)
    (loss, _, logprob), (ref_loss, _), _ = _on_policy_pair(hidden, weight, targets, batch, **COEFS)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(loss, loss_ng, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(logprob, lp_ng)
