import math

import pytest
import torch

from seedfast.algo import losses
from seedfast.algo.losses import LossOptions

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
COEFS = dict(kl_coef=0.05, entropy_coef=0.01, opd_coef=0.3)
SOFT_OR = LossOptions(**COEFS, gate="soft_or")


def _batch(seed: int, b: int = 5, t: int = 8, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)

    def lp():
        return -torch.rand(b, t, generator=g, dtype=dtype) * 3

    logprob = lp()
    return dict(
        logprob=logprob,
        old_logprob=logprob + torch.randn(b, t, generator=g, dtype=dtype) * 0.5,
        advantages=torch.randn(b, generator=g, dtype=dtype),
        mask=torch.rand(b, t, generator=g) < 0.75,
        entropy=torch.rand(b, t, generator=g, dtype=dtype) * 2,
        ref_logprob=lp(),
        teacher_logprob=lp(),
        teacher_mask=torch.tensor([True] * (b - 1) + [False]),
    )


@pytest.mark.parametrize("agg", MODES)
@pytest.mark.parametrize("gate", ["gap", "soft_or"])
def test_total_is_the_composition_of_its_terms(agg, gate):
    x = _batch(0)
    loss, metrics = losses.total_loss(**x, options=LossOptions(**COEFS, gate=gate, kl_kind="k2"), agg=agg)
    pg, _ = losses.policy_loss(x["logprob"], x["old_logprob"], x["advantages"], x["mask"], agg=agg)
    kl = losses.aggregate(losses.kl_penalty(x["logprob"], x["ref_logprob"], "k2"), x["mask"], agg)
    ent = losses.aggregate(x["entropy"], x["mask"], agg)
    opd, _ = losses.opd_loss(x["logprob"], x["teacher_logprob"], x["mask"], gate=gate, entropy=x["entropy"],
                             agg=agg, teacher_mask=x["teacher_mask"])
    expected = pg + 0.05 * kl - 0.01 * ent + 0.3 * opd
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(metrics["loss"], expected)
    torch.testing.assert_close(metrics["pg_loss"], pg)
    torch.testing.assert_close(metrics["opd_loss"], opd)


def test_total_matches_a_scalar_token_loop():
    """The loss of docs/algorithms.md written token by token in plain Python (token-mean, k3, gap gate)."""
    x = _batch(1)
    loss, _ = losses.total_loss(**x, options=LossOptions(**COEFS, opd_beta=5.0))
    valid, tvalid = x["mask"].tolist(), x["teacher_mask"].tolist()
    pg_sum = opd_sum = count = 0.0
    for i, row in enumerate(valid):
        a = x["advantages"][i].item()
        for j, ok in enumerate(row):
            if not ok:
                continue
            lp, old = x["logprob"][i, j].item(), x["old_logprob"][i, j].item()
            rho = math.exp(lp - old)
            pg = max(-a * rho, -a * min(max(rho, 0.8), 1.2))
            if a < 0:
                pg = min(pg, -a * 3.0)
            r = x["ref_logprob"][i, j].item() - lp
            kl = min(max(math.exp(r) - r - 1, -10), 10)
            pg_sum += pg + 0.05 * kl - 0.01 * x["entropy"][i, j].item()
            if tvalid[i]:
                delta = x["teacher_logprob"][i, j].item() - lp
                opd_sum += delta / (1 + math.exp(-5.0 * delta))
            count += 1
    assert loss.item() == pytest.approx(pg_sum / count + 0.3 * opd_sum / count, rel=1e-12)


def test_zero_coefficients_reduce_to_the_policy_loss_and_only_add_metrics():
    x = _batch(2)
    loss, metrics = losses.total_loss(**x)
    pg, _ = losses.policy_loss(x["logprob"], x["old_logprob"], x["advantages"], x["mask"])
    torch.testing.assert_close(loss, pg)
    assert {"kl", "entropy", "gate_mean", "gap_mean", "opd_term", "opd_loss", "clip_frac"} <= metrics.keys()
    bare, bare_metrics = losses.total_loss(x["logprob"], x["old_logprob"], x["advantages"], x["mask"])
    torch.testing.assert_close(bare, pg)
    assert "kl" not in bare_metrics and "gate_mean" not in bare_metrics


@pytest.mark.parametrize("agg", MODES)
def test_per_token_gradients_match_the_spec_scalars(agg):
    """∂L/∂ℓθ_t = a_t and ∂L/∂H_t = b_t as docs/algorithms.md derives them (what the fused kernel computes)."""
    x = _batch(3)
    lp = x["logprob"].clone().requires_grad_(True)
    h = x["entropy"].clone().requires_grad_(True)
    loss, _ = losses.total_loss(**{**x, "logprob": lp, "entropy": h}, options=LossOptions(**COEFS), agg=agg)
    loss.backward()

    w = losses.aggregation_weights(x["mask"], agg, dtype=torch.float64)
    terms = losses.policy_terms(x["logprob"], x["old_logprob"], x["advantages"][:, None])
    active = ~terms.clipped & ~terms.dual_clipped  # pg = −A·ρ: d pg/dℓθ = −A·ρ, else 0
    dpg = torch.where(active, -x["advantages"][:, None] * terms.ratio, 0.0)
    dkl = 1 - torch.exp(x["ref_logprob"] - x["logprob"])  # k3, none clamped at these values
    g = losses.gate(x["logprob"], x["teacher_logprob"], 5.0)
    m = x["mask"] & x["teacher_mask"][:, None]
    a_t = w * (dpg + 0.05 * dkl) - 0.3 * w * m * g
    torch.testing.assert_close(lp.grad, a_t)
    torch.testing.assert_close(h.grad, -0.01 * w)


def test_logit_gradient_factorizes_into_two_per_token_scalars():
    """∂L/∂z_t = a_t·(onehot(y_t) − p_t) + b_t·(−p_t ⊙ (log p_t + H_t)) with a tiny materialized vocab."""
    g = torch.Generator().manual_seed(4)
    b, t, v = 3, 4, 11
    logits = torch.randn(b, t, v, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, v, (b, t), generator=g)
    x = _batch(4, b, t)
    logp_all = torch.log_softmax(logits, dim=-1)
    lp = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    h = -(logp_all.exp() * logp_all).sum(-1)
    args = {**x, "old_logprob": lp.detach() + 0.1, "ref_logprob": lp.detach() - 0.2}
    loss, _ = losses.total_loss(**{**args, "logprob": lp, "entropy": h}, options=SOFT_OR)
    (grad_z,) = torch.autograd.grad(loss, logits)

    lp_leaf, h_leaf = lp.detach().requires_grad_(True), h.detach().requires_grad_(True)
    loss_leaf, _ = losses.total_loss(**{**args, "logprob": lp_leaf, "entropy": h_leaf}, options=SOFT_OR)
    a_t, b_t = torch.autograd.grad(loss_leaf, (lp_leaf, h_leaf))
    p = logp_all.detach().exp()
    onehot = torch.nn.functional.one_hot(targets, v).to(p.dtype)
    expected = a_t[..., None] * (onehot - p) + b_t[..., None] * (-p * (logp_all.detach() + h.detach()[..., None]))
    torch.testing.assert_close(grad_z, expected)


@pytest.mark.parametrize("agg", MODES)
@pytest.mark.parametrize("splits", [[2, 3], [1, 1, 1, 1, 1], [4, 1]])
def test_micro_batches_with_global_counts_sum_to_the_full_loss(agg, splits):
    x = _batch(5)
    global_tokens, global_seqs = int(x["mask"].sum()), int(x["mask"].any(dim=1).sum())
    full, _ = losses.total_loss(**x, options=LossOptions(**COEFS), agg=agg)
    parts = []
    for k in range(len(splits)):
        chunk = {name: value.split(splits)[k] for name, value in x.items()}
        part, _ = losses.total_loss(**chunk, options=LossOptions(**COEFS), agg=agg, global_tokens=global_tokens,
                                    global_seqs=global_seqs)
        parts.append(part)
    torch.testing.assert_close(sum(parts), full)


def test_nan_and_inf_in_padding_do_not_reach_loss_or_gradients():
    x = _batch(6)
    clean, _ = losses.total_loss(**x, options=SOFT_OR)
    pad = ~x["mask"]
    dirty = {k: (v.masked_fill(pad, float("nan")) if v.is_floating_point() and v.dim() == 2 else v)
             for k, v in x.items()}
    dirty["old_logprob"] = x["old_logprob"].masked_fill(pad, float("-inf"))
    lp = dirty["logprob"].requires_grad_(True)
    h = dirty["entropy"].requires_grad_(True)
    loss, metrics = losses.total_loss(**{**dirty, "logprob": lp, "entropy": h}, options=SOFT_OR)
    loss.backward()
    torch.testing.assert_close(loss, clean)
    assert torch.isfinite(lp.grad).all() and torch.isfinite(h.grad).all()
    assert all(torch.isfinite(v) for v in metrics.values())


def test_total_loss_rejects_missing_tensors_and_bad_options():
    x = _batch(7)
    bare = {k: x[k] for k in ("logprob", "old_logprob", "advantages", "mask")}
    with pytest.raises(ValueError, match="nonzero coefficient for ref_logprob.*ref_logprob is None"):
        losses.total_loss(**bare, options=LossOptions(kl_coef=0.01))
    with pytest.raises(ValueError, match="nonzero coefficient for entropy"):
        losses.total_loss(**bare, options=LossOptions(entropy_coef=0.01))
    with pytest.raises(ValueError, match="nonzero coefficient for teacher_logprob"):
        losses.total_loss(**bare, options=LossOptions(opd_coef=0.01))
    with pytest.raises(ValueError, match=r"total_loss: gate='entropy' needs entropy"):
        losses.total_loss(**bare, teacher_logprob=x["teacher_logprob"], options=LossOptions(gate="entropy"))
    with pytest.raises(ValueError, match=r"unknown kl_kind='k4'"):
        losses.total_loss(**bare, options=LossOptions(kl_kind="k4"))
    with pytest.raises(ValueError, match=r"ref_logprob has shape \(5, 7\) but logprob has shape \(5, 8\)"):
        losses.total_loss(**bare, ref_logprob=torch.zeros(5, 7))
