"""The rollout correction (docs/algorithms.md, 'Rollout correction') against hand-computed weights, shares and
diagnostics, and the fold of its weight into the advantages against the weighted PPO term written out here."""

import math

import pytest
import torch

from seedfast.algo import losses
from seedfast.algo.correction import (
    CorrectionOptions,
    correction_metrics,
    merge_sums,
    rollout_correction,
)

# two responses: three tokens with ratios 3, 0.5, 1 and two with 1.2, 0.1 (the third slot is padding)
RATIOS = [[3.0, 0.5, 1.0], [1.2, 0.1, float("nan")]]
ROLLOUT = [[-1.0, -2.0, -0.5], [-0.3, -1.5, float("nan")]]
MASK = torch.tensor([[True, True, True], [True, True, False]])


def _inputs():
    rollout = torch.tensor(ROLLOUT, dtype=torch.float64)
    train = torch.log(torch.tensor(RATIOS, dtype=torch.float64)) + rollout
    train[1, 2] = -float("inf")  # padding may hold anything
    return train, rollout


def _run(**options):
    train, rollout = _inputs()
    return rollout_correction(train, rollout, MASK, CorrectionOptions(**options))


def _close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("mode, options, weight, masked_tokens, truncated_tokens, masked_seqs, truncated_seqs", [
    ("none", {}, [[1, 1, 1], [1, 1, 0]], 0, 0, 0, 0),
    # min(ρ, 2): the ratio 3 is cut to 2
    ("token_tis", {}, [[2.0, 0.5, 1.0], [1.2, 0.1, 0]], 0, 1, 0, 1),
    # Π ρ: 1.5 and 0.12, under the default clip 5
    ("seq_tis", {}, [[1.5] * 3, [0.12, 0.12, 0]], 0, 0, 0, 0),
    ("seq_tis", {"seq_clip": 1.4}, [[1.4] * 3, [0.12, 0.12, 0]], 0, 3, 0, 1),
    # geometric means 1.5^(1/3) = 1.1447 and 0.12^(1/2) = 0.3464: the default [0.99, 1.01] drops both
    ("seq_geo_mask", {}, [[0, 0, 0], [0, 0, 0]], 5, 0, 2, 0),
    ("seq_geo_mask", {"geo_low": 0.3, "geo_high": 1.2}, [[1, 1, 1], [1, 1, 0]], 0, 0, 0, 0),
    ("seq_geo_mask", {"geo_low": 0.5, "geo_high": 1.2}, [[1, 1, 1], [0, 0, 0]], 2, 0, 1, 0),
    # IcePop [0.45, 5] (default low 0.5, moved off the ratio 0.5 that exp(log) rounds across): keeps ρ; 0.1 is out
    ("token_mask", {"token_low": 0.45}, [[3.0, 0.5, 1.0], [1.2, 0, 0]], 1, 0, 0, 0),
    ("token_mask", {"token_low": 0.55, "token_high": 2.5}, [[0, 0, 1.0], [1.2, 0, 0]], 3, 0, 0, 0),
    ("token_mask", {"token_low": 0.6, "token_high": 2.0}, [[0, 0, 1.0], [1.2, 0, 0]], 3, 0, 0, 0),
])
def test_weights_and_shares_by_hand(mode, options, weight, masked_tokens, truncated_tokens, masked_seqs,
                                    truncated_seqs):
    result = _run(mode=mode, **options)
    _close(result.weight, weight)
    assert int(result.masked.sum()) == masked_tokens
    assert int(result.truncated.sum()) == truncated_tokens
    assert not bool((result.masked | result.truncated)[~MASK].any())  # padding is never counted
    m = correction_metrics(result.sums)
    assert m["token_masked_share"] == pytest.approx(masked_tokens / 5)
    assert m["token_truncated_share"] == pytest.approx(truncated_tokens / 5)
    assert m["seq_masked_share"] == pytest.approx(masked_seqs / 2)
    assert m["seq_truncated_share"] == pytest.approx(truncated_seqs / 2)
    assert m["weight_mean"] == pytest.approx(sum(map(sum, weight)) / 5)
    assert not result.weight.requires_grad


def test_diagnostics_by_hand_whatever_the_mode():
    ratios = [3.0, 0.5, 1.0, 1.2, 0.1]
    gaps = [abs(math.log(r)) for r in ratios]
    k3 = [r - 1 - math.log(r) for r in ratios]  # KL(rollout ‖ train) on rollout samples: ρ − 1 − log ρ
    rollout_rows = [[-1.0, -2.0, -0.5], [-0.3, -1.5]]
    train_rows = [[lr + math.log(r) for lr, r in zip(row, rs)] for row, rs in zip(rollout_rows, RATIOS)]

    def ppl(rows):  # mean over the sequences of exp(−mean log-prob), as verl's training_ppl / rollout_ppl
        return sum(math.exp(-sum(row) / len(row)) for row in rows) / len(rows)

    for mode in ("none", "token_tis", "seq_tis", "seq_geo_mask", "token_mask"):
        m = correction_metrics(_run(mode=mode).sums)
        assert m["gap_mean"] == pytest.approx(sum(gaps) / 5)
        assert m["gap_max"] == pytest.approx(math.log(10.0))
        assert m["k3_kl"] == pytest.approx(sum(k3) / 5)
        assert m["training_ppl"] == pytest.approx(ppl(train_rows))
        assert m["rollout_ppl"] == pytest.approx(ppl(rollout_rows))


def test_equal_logprobs_give_weight_one_and_a_zero_gap():
    lp = torch.tensor([[-0.7, -1.1, -2.0]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    for mode in ("none", "token_tis", "seq_tis", "seq_geo_mask", "token_mask"):
        result = rollout_correction(lp, lp.clone(), mask, CorrectionOptions(mode=mode))
        _close(result.weight, [[1.0, 1.0, 1.0]])
        m = correction_metrics(result.sums)
        assert m["gap_mean"] == m["gap_max"] == m["k3_kl"] == 0.0
        assert m["training_ppl"] == m["rollout_ppl"] == pytest.approx(math.exp((0.7 + 1.1 + 2.0) / 3))


def test_a_zero_length_response_counts_nowhere():
    train = torch.tensor([[-1.0, -1.0], [0.0, 0.0]], dtype=torch.float64)
    rollout = torch.tensor([[-1.5, -0.5], [5.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [False, False]])
    for mode in ("none", "token_tis", "seq_tis", "seq_geo_mask", "token_mask"):
        result = rollout_correction(train, rollout, mask, CorrectionOptions(mode=mode))
        assert result.weight[1].tolist() == [0.0, 0.0]
        assert not bool(result.masked[1].any()) and not bool(result.truncated[1].any())
        assert float(result.sums["seqs"]) == 1 and float(result.sums["tokens"]) == 2
        assert correction_metrics(result.sums)["gap_max"] == pytest.approx(0.5)


def test_no_response_token_at_all_gives_no_metrics():
    empty = torch.zeros(2, 0, dtype=torch.float64)
    result = rollout_correction(empty, empty, torch.zeros(2, 0, dtype=torch.bool), CorrectionOptions(mode="seq_tis"))
    assert result.weight.shape == (2, 0)
    assert correction_metrics(result.sums) == {}


def test_huge_ratios_stay_finite():
    train = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    rollout = torch.tensor([[-60.0, -60.0]], dtype=torch.float64)  # log ρ = 60 per token: clamped at ±20
    mask = torch.ones(1, 2, dtype=torch.bool)
    for mode in ("token_tis", "seq_tis", "token_mask"):
        result = rollout_correction(train, rollout, mask, CorrectionOptions(mode=mode))
        assert bool(torch.isfinite(result.weight).all())
        assert all(math.isfinite(v) for v in correction_metrics(result.sums).values())
    assert rollout_correction(train, rollout, mask, CorrectionOptions(mode="token_tis")).weight.tolist() == [[2.0, 2.0]]


def test_sums_merge_like_one_call():
    train, rollout = _inputs()
    options = CorrectionOptions(mode="token_tis")
    whole = rollout_correction(train, rollout, MASK, options).sums
    parts = [rollout_correction(train[i:i + 1], rollout[i:i + 1], MASK[i:i + 1], options).sums for i in range(2)]
    merged = merge_sums(merge_sums(None, parts[0]), parts[1])
    assert correction_metrics(merged) == pytest.approx(correction_metrics(whole))


@pytest.mark.parametrize("options, match", [
    ({"mode": "tis"}, "unknown mode"),
    ({"mode": "token_tis", "token_clip": 0.0}, "token_clip must be > 0"),
    ({"mode": "seq_geo_mask", "geo_low": 1.1, "geo_high": 1.0}, "geo_low=1.1 is above geo_high"),
    ({"mode": "token_mask", "token_low": 6.0}, "token_low=6.0 is above token_high"),
])
def test_bad_options_name_the_option(options, match):
    train, rollout = _inputs()
    with pytest.raises(ValueError, match=match):
        rollout_correction(train, rollout, MASK, CorrectionOptions(**options))


def test_non_finite_logprobs_at_a_response_token_are_refused():
    train, rollout = _inputs()
    rollout[0, 1] = float("nan")
    with pytest.raises(ValueError, match="rollout_logprob holds a non-finite value"):
        rollout_correction(train, rollout, MASK, CorrectionOptions(mode="token_tis"))


# ---------------------------------------------------------------------------------- the weight on the PPO term

def _weighted_ppo_by_hand(logprob, old, adv, w, clip=0.2, dual=3.0):
    """w·max(−Aρ, −A·clip(ρ, 1 ± ε)), capped at w·(−A·c) for A < 0: the weighted term written out per token."""
    ratio = torch.exp(logprob - old)
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip))
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * dual), pg)
    return w * pg


def test_folding_the_weight_into_the_advantage_is_the_weighted_ppo_term():
    # every branch: inside the region, clipped above and below, dual-clipped, weights 0, < 1, truncated 2, > 2
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, -2.0, 0.5, -0.5, 1.5]], dtype=torch.float64)
    log_ratio = torch.tensor([[0.1, 0.5, -0.5, 1.8, 0.05, -0.05, 0.0, 0.3]], dtype=torch.float64)
    w = torch.tensor([[1.0, 0.5, 2.0, 0.7, 0.0, 3.0, 1.3, 0.2]], dtype=torch.float64)
    old = torch.full_like(adv, -1.3)
    mask = torch.ones_like(adv, dtype=torch.bool)

    folded_lp = (old + log_ratio).requires_grad_()
    folded, _ = losses.policy_loss(folded_lp, old, adv * w, mask)
    folded.backward()
    ref_lp = (old + log_ratio).requires_grad_()
    ref = _weighted_ppo_by_hand(ref_lp, old, adv, w).mean()
    ref.backward()
    assert folded.item() == pytest.approx(ref.item(), rel=1e-12)
    torch.testing.assert_close(folded_lp.grad, ref_lp.grad, rtol=1e-12, atol=1e-15)
    assert folded_lp.grad[0, 4].item() == 0.0  # a masked token has no gradient


def test_token_tis_gradient_on_policy_by_hand():
    """θ = θ_old: ∂/∂ℓθ_t of mean_t(w_t·pg_t) is −A_t·w_t / N, w_t = min(ρ_rollout_t, 2)."""
    train = torch.tensor([[-1.0, -0.2, -3.0]], dtype=torch.float64)
    rollout = torch.tensor([[-1.5, -0.2, -2.0]], dtype=torch.float64)  # ratios e^0.5, 1, e^−1
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    w = rollout_correction(train, rollout, mask, CorrectionOptions(mode="token_tis")).weight
    _close(w, [[math.exp(0.5), 1.0, math.exp(-1.0)]])
    lp = train.clone().requires_grad_()
    loss, _ = losses.policy_loss(lp, train, adv * w, mask)
    loss.backward()
    _close(lp.grad, [[-math.exp(0.5) / 3, 2.0 / 3, -0.5 * math.exp(-1.0) / 3]])


def test_all_masked_leaves_no_policy_gradient():
    train, rollout = _inputs()
    w = rollout_correction(train, rollout, MASK, CorrectionOptions(mode="seq_geo_mask")).weight
    assert float(w.sum()) == 0.0
    lp = torch.where(MASK, train, 0.0).requires_grad_()
    loss, _ = losses.policy_loss(lp, lp.detach() - 0.1, torch.ones(2, dtype=torch.float64)[:, None] * w, MASK)
    loss.backward()
    assert loss.item() == 0.0 and float(lp.grad.abs().sum()) == 0.0


@pytest.mark.parametrize("mode", ["seq_tis", "seq_geo_mask"])
def test_rows_of_one_group_share_one_sequence_weight_by_hand(mode):
    """`groups`: the rows of one trajectory are one sequence. Rows 0 and 1 are one trajectory (log ratios 0.1, 0.2 and
    -0.05: Σ 0.25 over 3 tokens), row 2 another (0.4 over 2 tokens)."""
    logs = [[0.1, 0.2], [-0.05, 0.0], [0.3, 0.1]]
    mask = torch.tensor([[True, True], [True, False], [True, True]])
    rollout = torch.full((3, 2), -1.0, dtype=torch.float64)
    train = rollout + torch.tensor(logs, dtype=torch.float64)
    options = CorrectionOptions(mode=mode, seq_clip=100.0, geo_low=0.95, geo_high=1.1)
    grouped = rollout_correction(train, rollout, mask, options, groups=torch.tensor([0, 0, 1]))
    alone = rollout_correction(train, rollout, mask, options)
    if mode == "seq_tis":
        traj = [math.exp(0.25), math.exp(0.25), math.exp(0.4)]
        step = [math.exp(0.3), math.exp(-0.05), math.exp(0.4)]
    else:  # geometric means: trajectory 0 exp(0.25 / 3) = 1.087 (kept), trajectory 1 exp(0.2) = 1.22 (masked);
        traj = [1.0, 1.0, 0.0]  # alone: exp(0.15) = 1.16 masked, exp(-0.05) = 0.951 kept, 1.22 masked
        step = [0.0, 1.0, 0.0]
    _close(grouped.weight, [[w * m for m in row] for w, row in zip(traj, mask.tolist())])
    _close(alone.weight, [[w * m for m in row] for w, row in zip(step, mask.tolist())])
    # the diagnostics stay per row, whatever the grouping
    assert grouped.sums["seqs"] == alone.sums["seqs"] == 3
    assert float(grouped.sums["gap_abs"]) == pytest.approx(float(alone.sums["gap_abs"]))
    # groups change nothing for the token modes
    for token_mode in ("token_tis", "token_mask"):
        opts = CorrectionOptions(mode=token_mode)
        together = rollout_correction(train, rollout, mask, opts, groups=torch.tensor([0, 0, 1]))
        torch.testing.assert_close(together.weight, rollout_correction(train, rollout, mask, opts).weight)


def test_bad_groups_are_refused():
    train, rollout = _inputs()
    with pytest.raises(ValueError, match="groups must be"):
        rollout_correction(train, rollout, MASK, CorrectionOptions(mode="seq_tis"), groups=torch.tensor([0]))
    with pytest.raises(ValueError, match="groups must be"):
        rollout_correction(train, rollout, MASK, CorrectionOptions(mode="seq_tis"), groups=torch.tensor([0.0, 1.0]))
