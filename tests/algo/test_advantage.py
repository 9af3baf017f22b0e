import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seedfast.algo import advantage


def test_grpo_hand_example_with_unbiased_std():
    # group a: rewards 1,0,0,1 -> mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0, 2.0, 2.0])
    adv = advantage.grpo(rewards, ["a", "a", "a", "a", "b", "c", "c"], eps=1e-6)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # 0.866024...
    expected = torch.tensor([a, -a, -a, a, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)


def test_grpo_mean_norm_subtracts_the_group_mean_only():
    rewards = torch.tensor([1.0, 0.0, 0.0, 2.0, 7.0])
    adv = advantage.grpo(rewards, [0, 0, 0, 0, 1], norm="mean")
    torch.testing.assert_close(adv, torch.tensor([0.25, -0.75, -0.75, 1.25, 0.0]))


@pytest.mark.parametrize("norm", ["mean_std", "mean"])
def test_zero_variance_and_single_sample_groups_give_exactly_zero(norm):
    # 0.1 + 0.1 + 0.1 != 0.3 in floating point: the float group mean differs from the values,
    # so a naive (r - mean) would be a tiny nonzero that mean_std then blows up.
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 3.0, 1.0, 0.0], dtype=torch.float64)
    adv = advantage.grpo(rewards, [0, 0, 0, 1, 2, 3, 3], norm=norm)
    assert torch.isfinite(adv).all()
    assert (adv[:5] == 0).all()
    assert (adv[5:] != 0).all()


def test_group_ids_as_int_tensor_and_as_hashables_agree():
    rewards = torch.tensor([1, 0, 1, 1, 0, 3], dtype=torch.int64)
    by_tensor = advantage.grpo(rewards, torch.tensor([7, 7, 3, 3, 3, 9]))
    by_list = advantage.grpo(rewards, [("t", 7), ("t", 7), ("t", 3), ("t", 3), ("t", 3), ("t", 9)])
    assert by_tensor.dtype == torch.float32
    torch.testing.assert_close(by_tensor, by_list)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0.0, 0.5, 1.0, -0.1, 2.0])), min_size=1, max_size=30),
       st.sampled_from(["mean_std", "mean"]))
def test_grpo_matches_a_per_group_loop_with_torch_std(samples, norm):
    groups = [g for g, _ in samples]
    rewards = torch.tensor([r for _, r in samples], dtype=torch.float64)
    adv = advantage.grpo(rewards, groups, norm=norm, eps=1e-6)
    for g in set(groups):
        idx = torch.tensor([i for i, x in enumerate(groups) if x == g])
        r = rewards[idx]
        if len(idx) < 2 or (r == r[0]).all():
            expected = torch.zeros_like(r)
        elif norm == "mean_std":
            expected = (r - r.mean()) / (torch.std(r) + 1e-6)
        else:
            expected = r - r.mean()
        torch.testing.assert_close(adv[idx], expected, rtol=1e-9, atol=1e-9)


def test_group_normalize_ignores_invalid_entries():
    values = torch.tensor([3.0, float("nan"), 1.0, 5.0])
    valid = torch.tensor([True, False, True, False])
    out = advantage.group_normalize(values, [0, 0, 0, 0], valid, eps=0.0)
    std = math.sqrt(2.0)  # values 3, 1: mean 2, unbiased std sqrt(2)
    torch.testing.assert_close(out, torch.tensor([1 / std, 0.0, -1 / std, 0.0]))


def test_per_token_broadcasts_to_valid_tokens_only():
    adv = torch.tensor([0.5, -2.0])
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    expected = torch.tensor([[0.5, 0.5, 0.0], [0.0, -2.0, -2.0]])
    torch.testing.assert_close(advantage.per_token(adv, mask), expected)


def test_grpo_rejects_bad_inputs_with_one_clear_error():
    with pytest.raises(ValueError, match=r"rewards\[2\] = nan"):
        advantage.grpo(torch.tensor([1.0, 0.0, float("nan")]), [0, 0, 0])
    with pytest.raises(ValueError, match="group_ids has 2 entries; expected 3"):
        advantage.grpo(torch.tensor([1.0, 0.0, 1.0]), [0, 0])
    with pytest.raises(ValueError, match=r"group_ids has shape \(2, 2\)"):
        advantage.grpo(torch.zeros(4), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="group_ids must be an integer tensor"):
        advantage.grpo(torch.zeros(2), torch.tensor([0.0, 1.0]))
    with pytest.raises(TypeError, match="hashable"):
        advantage.grpo(torch.zeros(2), [[0], [1]])
    with pytest.raises(ValueError, match=r"unknown norm='std'.*'mean_std', 'mean'"):
        advantage.grpo(torch.zeros(2), [0, 0], norm="std")
    with pytest.raises(ValueError, match=r"rewards must be \[S\]"):
        advantage.grpo(torch.zeros(2, 2), [0, 0])
    with pytest.raises(ValueError, match=r"advantages has shape \(3,\) but mask has shape \(2, 4\)"):
        advantage.per_token(torch.zeros(3), torch.ones(2, 4))


# ------------------------------------------------------------------ step penalties (invalid actions)

def _no_winner_group():
    # one group, nobody wins; steps 1 and 4 were invalid actions (penalty 0.1)
    outcomes = torch.zeros(6)
    penalties = torch.tensor([0.0, 0.1, 0.0, 0.0, 0.1, 0.0])
    return outcomes, penalties, [0] * 6


def test_penalty_after_norm_never_gives_a_no_winner_group_a_win_sized_advantage():
    outcomes, penalties, groups = _no_winner_group()
    adv = advantage.grpo_with_penalty(outcomes, penalties, groups)
    torch.testing.assert_close(adv, -penalties)  # valid steps 0, invalid steps -0.1: nothing rewards a loser
    assert adv.max() <= 0 and adv.abs().max() <= 0.1 + 1e-7


def test_penalty_in_reward_is_the_reference_and_blows_the_penalty_up_to_a_win():
    # rewards 0,-0.1,0,0,-0.1,0: mean -1/30, unbiased std = sqrt((4/900 + 2*4/900) / 5) = sqrt(1/375)
    outcomes, penalties, groups = _no_winner_group()
    adv = advantage.grpo_with_penalty(outcomes, penalties, groups, penalty_mode="in_reward")
    std = math.sqrt(1 / 375)
    expected = torch.tensor([1 / 30, -1 / 15, 1 / 30, 1 / 30, -1 / 15, 1 / 30]) / (std + 1e-6)
    torch.testing.assert_close(adv, expected)
    win = advantage.grpo(torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 0.0]), groups)[0]
    assert adv.abs().max() > 0.5 * win  # the failure mode: a penalty worth about as much as a win
    assert (adv[[0, 2, 3, 5]] > 0).all()  # valid but useless steps of losers get rewarded


def test_penalty_after_norm_keeps_the_outcome_signal_and_subtracts_the_raw_penalty():
    outcomes = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    penalties = torch.tensor([0.0, 0.1, 0.1, 0.0, 0.0, 0.0])
    groups = [0, 0, 0, 0, 1, 1]
    adv = advantage.grpo_with_penalty(outcomes, penalties, groups)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    b = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(adv, torch.tensor([a, a - 0.1, -a - 0.1, -a, b, -b]))
    assert (adv[:2] > 0).all() and (adv[2:4] < 0).all()  # a penalty never flips a winner's sign


def test_penalty_input_errors_name_the_tensor():
    with pytest.raises(ValueError, match="penalties has shape"):
        advantage.grpo_with_penalty(torch.zeros(3), torch.zeros(2), [0, 0, 0])
    with pytest.raises(ValueError, match=r"penalties\[1\] = -0.1"):
        advantage.grpo_with_penalty(torch.zeros(2), torch.tensor([0.0, -0.1]), [0, 0])
    with pytest.raises(ValueError, match="penalty_mode"):
        advantage.grpo_with_penalty(torch.zeros(2), torch.zeros(2), [0, 0], penalty_mode="raw")
