"""The SmolLM2 study's analysis (experiments/smollm2_study.py, docs/study_smollm2.md) on hand-made inputs, each
expected value computed by hand: the paired differences per game, a seed's summary, the intervals, the variance of a
game's difference at its bound, the power, and the criterion's answer. No training."""

import json
import math

import pytest

from experiments import smollm2_study as s


def plays(won: list[int], prefix: str = "g", actions: list[list[str]] | None = None) -> list[dict]:
    return [{"game_id": f"{prefix}{i}", "won": bool(w), "steps": 1, "invalid": 0,
             "actions": (actions or [["go east"]] * len(won))[i]} for i, w in enumerate(won)]


# ------------------------------------------------------------------ paired differences and one seed


def test_paired_differences_match_games_by_id_and_average_their_plays():
    after = plays([1, 0, 1]) + [{"game_id": "g0", "won": False, "steps": 1, "invalid": 0, "actions": []}]
    before = list(reversed(plays([0, 1, 1])))  # the order of the plays does not matter, the game ids do
    assert s.paired_differences(after, before) == {"g0": 0.5, "g1": -1.0, "g2": 0.0}  # g0: (1 + 0) / 2 − 0


def test_paired_differences_refuse_records_of_other_games():
    with pytest.raises(ValueError, match="different games"):
        s.paired_differences(plays([1, 1]), plays([1, 1, 1]))


def test_seed_summary():
    # mean 0.2; squared deviations 0.64 + 0.04 + 0.04 + 1.44 + 0.64 = 2.8, over n − 1 = 4: 0.7
    assert s.seed_summary([1, 0, 0, -1, 1]) == pytest.approx(
        {"games": 5, "d": 0.2, "gained": 2, "lost": 1, "same": 2, "variance": 0.7})


# ------------------------------------------------------------------ intervals


def test_normal_interval_by_hand():
    # seed means 0.2 and 0.5: d̄ 0.35; variances 0.7 and 1/3; se = √(0.7/5 + (1/3)/4) / 2 = 0.236291
    lo, hi = s.normal_interval([[1, 0, 0, -1, 1], [1, 1, 0, 0]])
    assert (lo, hi) == pytest.approx((0.35 - 1.959964 * 0.236291, 0.35 + 1.959964 * 0.236291), abs=1e-5)


def test_bootstrap_interval_of_games_that_all_agree_is_their_value():
    assert s.bootstrap_interval([[1.0] * 10, [1.0] * 7]) == [1.0, 1.0]
    assert s.bootstrap_interval([[0.0] * 10, [1.0] * 4]) == [0.5, 0.5]  # each seed's resamples are all alike


def test_bootstrap_interval_is_fixed_by_its_seed_and_near_the_normal_one_on_many_games():
    per_seed = [[1] * 20 + [-1] * 10 + [0] * 162] * 3  # d_s = 10/192 at every seed
    first = s.bootstrap_interval(per_seed)
    assert first == s.bootstrap_interval(per_seed)
    lo, hi = s.normal_interval(per_seed)
    assert first[0] == pytest.approx(lo, abs=0.006) and first[1] == pytest.approx(hi, abs=0.006)
    assert first[0] < 10 / 192 < first[1]


# ------------------------------------------------------------------ power


def test_outcome_shares_and_variance_at_the_bound_and_independent():
    # start 0.79, effect 0.1: after 0.89. Bound: lost = min(1 − 0.89, 0.79) = 0.11, gained 0.21, Var 0.32 − 0.01
    assert s.outcome_shares(0.79, 0.1, "bound") == pytest.approx((0.21, 0.11))
    assert s.game_variance(0.79, 0.1, "bound") == pytest.approx(0.31)
    # independent: lost = 0.79 · 0.11 = 0.0869, gained 0.1869, Var 0.2738 − 0.01
    assert s.outcome_shares(0.79, 0.1, "independent") == pytest.approx((0.1869, 0.0869))
    assert s.game_variance(0.79, 0.1, "independent") == pytest.approx(0.2638)
    with pytest.raises(ValueError):
        s.outcome_shares(0.95, 0.1, "bound")


def test_interval_power_by_hand():
    # se = √(0.31/576) = 0.0231990; (0.1 − 1.959964 · se) / se = 2.350569; Φ(2.350569) = 0.990627
    assert s.interval_power(0.1, 0.31, 192, 3) == pytest.approx(0.990627, abs=1e-5)
    # τ 0.05: se_true = √((0.31/192 + 0.0025)/3) = 0.0370342; (0.1 − 0.0454691)/0.0370342 = 1.472450; Φ = 0.929549
    assert s.interval_power(0.1, 0.31, 192, 3, tau=0.05) == pytest.approx(0.929549, abs=1e-5)
    assert s.interval_power(0.0, 0.31, 192, 3) == pytest.approx(0.025, abs=1e-6)  # no effect: the test's size


def test_smallest_effect_by_bisection():
    assert s.smallest_effect(lambda e: e / 0.1) == pytest.approx(0.08, abs=1e-9)
    assert s.smallest_effect(lambda e: 0.5) is None


def test_simulated_power_at_its_extremes():
    # every game already won and no effect: every difference 0, the interval [0, 0] never lies above 0
    none = s.simulated_power(0.0, 1.0, "bound", 20, 3, draws=50, boot=50)
    assert none == {"interval": 0.0, "every_seed": 0.0, "criterion": 0.0, "t_over_seeds": 0.0}
    # start 0.5, effect 0.5: RL wins every game, half of them gained, none lost: every study says better
    every = s.simulated_power(0.5, 0.5, "bound", 20, 3, draws=50, boot=50)
    assert {k: every[k] for k in ("interval", "every_seed", "criterion")} == {
        "interval": 1.0, "every_seed": 1.0, "criterion": 1.0}


# ------------------------------------------------------------------ the criterion on records


def seed_records(start: list[int], after: list[int], grpo_pool: list[float], control_pool: list[float],
                 changed: int = 0) -> dict[str, dict]:
    machine = {"cpu": "AMD EPYC"}
    acts = [["go west"] if i < changed else ["go east"] for i in range(len(after))]
    per_update = {"train/success_rate": grpo_pool, "loss/ratio_min": [0.9, 0.95], "loss/ratio_max": [1.1, 1.05]}
    return {
        "start": {"heldout": {"eval/success_rate": sum(start) / len(start)}, "per_game": plays(start)},
        "grpo": {"heldout": {"eval/success_rate": sum(after) / len(after)},
                 "heldout_in_loop": {"eval/success_rate": sum(after) / len(after)},
                 "per_game": plays(after, actions=acts), "per_update": per_update, "machine": machine,
                 "git_commit": "c0ffee"},
        "control": {"per_update": {"train/success_rate": control_pool}},
    }


def data_of(*seeds: dict[str, dict]) -> dict:
    data = s.base()
    for seed, records in zip(s.SEEDS, seeds):
        data["runs"].update({f"s{seed}/{name}": r for name, r in records.items()})
    return data


def test_better_when_the_interval_every_seed_and_the_pool_agree():
    # 20 games a seed, the start wins 10; GRPO wins those and 6 more: d_s = 6/20 = 0.3 at every seed
    start, after = [1] * 10 + [0] * 10, [1] * 16 + [0] * 4
    data = data_of(*[seed_records(start, after, [0.5, 0.5, 1.0, 1.0], [0.5] * 4, changed=6)] * 3)
    a = s.analyze(data)
    assert a["d"] == pytest.approx(0.3) and a["pool_lead"] == pytest.approx(0.5)  # (1 + 1)/2 − 0.5
    assert a["seeds"]["60"]["gained"] == 6 and a["seeds"]["60"]["lost"] == 0 and a["seeds"]["60"]["changed"] == 6
    assert a["seeds"]["60"]["ratio_range"] == [0.9, 1.1] and a["seeds"]["60"]["first_update_equal"]
    assert a["ci95"][0] > 0 and a["clauses"] == {"interval": True, "every_seed": True, "pool": True}
    assert a["answer"] == "better"
    assert a["t_over_seeds"]["mean"] == pytest.approx(0.3) and a["t_over_seeds"]["sd"] == pytest.approx(0.0)


def test_not_shown_when_one_seed_is_not_above_zero_and_worse_when_the_interval_is_below():
    start, after = [1] * 10 + [0] * 10, [1] * 16 + [0] * 4
    same = seed_records(start, start, [0.5] * 4, [0.5] * 4)  # d_s = 0, pool lead 0
    a = s.analyze(data_of(seed_records(start, after, [0.5, 0.5, 1, 1], [0.5] * 4), same, same))
    assert a["d"] == pytest.approx(0.1) and a["clauses"]["every_seed"] is False and a["answer"] == "not shown"
    fell = seed_records(start, [1] * 2 + [0] * 18, [0.5, 0.5, 0, 0], [0.5] * 4)  # d_s = −0.4
    a = s.analyze(data_of(fell, fell, fell))
    assert a["ci95"][1] < 0 and a["answer"] == "worse"


def test_no_answer_until_every_seed_is_in_nor_across_commits():
    start, after = [1] * 10 + [0] * 10, [1] * 16 + [0] * 4
    one = seed_records(start, after, [0.5, 0.5, 1, 1], [0.5] * 4)
    a = s.analyze(data_of(one))
    assert not a["complete"] and "answer" not in a and a["d"] == pytest.approx(0.3)
    other = {**one, "grpo": {**one["grpo"], "git_commit": "beef"}}
    a = s.analyze(data_of(one, one, other))
    assert a["answer"] is None and "2 commits" in a["refused"]


def test_the_result_section_gives_the_answer_first():
    start, after = [1] * 10 + [0] * 10, [1] * 16 + [0] * 4
    data = data_of(*[seed_records(start, after, [0.5, 0.5, 1.0, 1.0], [0.5] * 4)] * 3)
    data["analysis"] = s.analyze(data)
    text = s.docs_section(data)
    assert text.startswith("**The answer: yes, RL makes SmolLM2-135M better**")
    assert "| 60 | AMD EPYC | 0.500 | 0.800 | +0.300 | 6 / 0 |" in text
    assert s.docs_section(s.base()).startswith("No run yet")


# ------------------------------------------------------------------ the protocol's record


def test_the_study_seeds_were_never_used_before():
    used = s.seeds_in_results()
    assert {0, 1, 5, 11, 40, 49} <= used  # the demo's, the tiny study's, the demo check's: the scan finds them
    assert not used & {*s.SEEDS, *s.TUNING_SEEDS}


def test_the_committed_protocol_holds_the_configs_design_and_its_own_power():
    power = json.loads(s.RESULT.read_text())["power"]
    assert power["design"] == json.loads(json.dumps(s.design()))  # a config changed after the protocol shows here
    row = next(r for r in power["rows"] if r["model"] == "bound" and r["tau"] == 0 and r["effect"] == 0.1)
    p = power["inputs"]["start_heldout"]["min"]
    assert row["variance"] == pytest.approx(s.game_variance(p, 0.1, "bound"))
    games, seeds = power["design"]["heldout_games"], len(power["design"]["seeds"])
    assert (games, seeds) == (384, 3)
    assert row["interval_normal"] == pytest.approx(s.interval_power(0.1, row["variance"], games, seeds))
    assert not math.isnan(row["criterion"])
