"""experiments/study_reading.py, what the study's data supports read after its answer: the simulated power against
the values it must have by construction, and each fact on hand-made study records, by hand."""

import math

import pytest

from experiments import study, study_reading

PRIMARY_D = [0.01, -0.02, 0.03, 0.0, 0.02, -0.01]  # the primary's d_s at seeds 5-10: d̄ +0.005


# ------------------------------------------------------------------ the power


def test_each_part_of_the_criterion_holds_as_often_as_it_must_by_construction():
    mins = study_reading.minimal_effects(0.04)
    # at a true 0 the 95% t-interval's lower end is above 0 in 2.5% of studies (the test's size)
    assert study_reading.power(mins, 0.0, ("interval",)) == pytest.approx(0.025, abs=0.002)
    # at a true +0.05 the mean of six is at least +0.05 half the time
    assert study_reading.power(mins, study.MARGIN, ("mean",)) == pytest.approx(0.5, abs=0.004)
    # at a true 0 each d_s is positive half the time: at least 5 of 6 with probability (1 + 6) / 64
    assert study_reading.power(mins, 0.0, ("positive",)) == pytest.approx(7 / 64, abs=0.003)
    # the mean alone reaches +0.05 80% of the time at +0.05 + z(0.8)·s/√6, z(0.8) = 0.8416
    assert study_reading.effect_for_power(mins, ("mean",)) == pytest.approx(0.05 + 0.8416 * 0.04 / math.sqrt(6),
                                                                            abs=5e-4)


def test_clause_one_is_both_of_its_parts_and_shrinks_to_the_margin_without_spread():
    mins = study_reading.minimal_effects(0.04)
    both = study_reading.power(mins, study.MARGIN)
    assert both <= min(study_reading.power(mins, study.MARGIN, ("mean",)),
                       study_reading.power(mins, study.MARGIN, ("interval",)))
    assert study_reading.power(mins, study.MARGIN, study_reading.CLAUSES_1_2) <= both
    tight = study_reading.minimal_effects(1e-6)
    assert study_reading.effect_for_power(tight) == pytest.approx(study.MARGIN, abs=1e-5)
    assert study_reading.minimal_effects(0.04)["mean"].tolist() == mins["mean"].tolist()  # seeded


# ------------------------------------------------------------------ the facts, on hand-made records


def record(seed, arm, pool, invalid=0.1, share=None, after=0.3):
    per_update = {"train/success_rate": [pool] * 16, "rollout/invalid_rate": [invalid] * 16}
    if share is not None:
        per_update["teacher/opd_share"] = share
    return {"seed": seed, "arm": arm, "per_update": per_update, "episodes_per_update": 64, "git_commit": "abc",
            "heldout_after": None if arm == "control" else {"eval/success_rate": after}}


def gap(oracle, oracle_ci, own=None, own_ci=None, invalid=0.2):
    gaps = {"oracle": {"mean": oracle, "ci95": oracle_ci}}
    if own is not None:
        gaps["own"] = {"mean": own, "ci95": own_ci}
    return {"gaps": gaps, "conditions": {"plain": {"success": 0.2, "mixed_groups": 0.4, "invalid_rate": invalid},
                                         "own": {"parse_share": 0.9}}}


SELECTION = {"seed": 11, "grid": study.GRID, "primary": "reverse_kl",
             "chosen": {"gate": 0.03, "advantage": 0.1, "reverse_kl": 0.03},
             "statistic": {"gate/0.01": 0.15, "gate/0.03": 0.2, "gate/0.1": 0.18, "gate/0.3": 0.13,
                           "advantage/0.1": 0.15, "advantage/0.3": 0.1, "advantage/1": 0.07, "advantage/3": 0.06,
                           "reverse_kl/0.03": 0.22, "reverse_kl/0.1": 0.13, "reverse_kl/0.3": 0.07,
                           "reverse_kl/1": 0.05},
             "collapsed": ["advantage/1", "advantage/3", "reverse_kl/1"]}


def hand_study():
    """Seeds 5-10: GRPO and the shuffled arm at 0.25, the primary (reverse_kl) at 0.25 + PRIMARY_D, the others at
    0.25; gate logs a share of 0.02 (seed 5: 0.04) and advantage 0.1; at seed 8 the start plays invalid actions
    0.6 of the time and the control, the primary and GRPO stay above 0.5, the other arms drop below at update 2."""
    runs = {}
    for i, s in enumerate(study.SEEDS):
        runs[f"sparse/s{s}/control"] = record(s, "control", 0.2)
        runs[f"sparse/s{s}/grpo"] = record(s, "grpo", 0.25)
        runs[f"sparse/s{s}/reverse_kl"] = record(s, "reverse_kl", 0.25 + PRIMARY_D[i])
        runs[f"sparse/s{s}/gate"] = record(s, "gate", 0.25, share=[0.04 if s == 5 else 0.02] * 16)
        runs[f"sparse/s{s}/advantage"] = record(s, "advantage", 0.25, share=[0.1] * 16)
        for arm in ("shuffled", "self"):
            runs[f"sparse/s{s}/{arm}"] = record(s, arm, 0.25)
    for arm in ("control", "grpo", "reverse_kl"):
        runs[f"sparse/s8/{arm}"]["per_update"]["rollout/invalid_rate"] = [0.6] * 15 + [0.4]
    for arm in ("gate", "advantage", "shuffled", "self"):
        runs[f"sparse/s8/{arm}"]["per_update"]["rollout/invalid_rate"] = [0.6] + [0.3] * 15
    gaps = {"P1/s5": gap(-0.1, [-0.16, -0.04], -0.05, [-0.1, 0.0], invalid=0.3),
            "P1/s6": gap(0.1, [0.05, 0.15], 0.02, [0.01, 0.03]),
            "P1/s8": gap(0.02, [-0.03, 0.07], -0.01, [-0.05, 0.03], invalid=0.6),
            "P1/s11": gap(-0.098, [-0.157, -0.038])}
    data = {**study._base(), "runs": runs, "selection": SELECTION, "pool": {"name": "P1", "overrides": []},
            "teacher_gap": gaps, "starts": {f"sparse/s{s}": {"eval/success_rate": 0.3} for s in study.SEEDS},
            "superseded": [{"seed": 5, "teacher_gap": gap(0.1, [0.03, 0.18], 0.01, [-0.05, 0.07])},
                           {"seed": 6, "teacher_gap": gap(0.05, [-0.01, 0.11])}],
            "deviations": [{"what": "run a", "why": "moved", "date": "2026-12-06T10:00:00+00:00", "commit": "a" * 40}]}
    data["analysis"] = study.analysis(data)
    return data


def test_the_facts_by_hand():
    data = hand_study()
    f = study_reading.facts(data)
    assert f["primary"] == "reverse_kl" and data["analysis"]["answer"] == "no"
    pw = f["power"]["reverse_kl"]
    assert pw["sd"] == pytest.approx(study.interval(PRIMARY_D)["sd"]) and pw["n"] == 6
    assert pw["at_margin"] == study_reading.power(study_reading.minimal_effects(pw["sd"]), study.MARGIN)
    # the other arms equal GRPO at every seed: s_d 0, so clause 1 holds exactly from +0.05 on
    assert f["power"]["gate"]["sd"] == 0 and f["power"]["gate"]["effect"] == pytest.approx(study.MARGIN)
    assert f["power"]["gate"]["at_margin"] == 1.0

    (s8,) = f["clause_5"]  # the primary collapsed at seed 8 only, by rule 3, as the control did
    assert s8["seed"] == 8 and s8["rules"] == ["3"] and s8["control_rules"] == ["3"]
    assert (s8["control_above_half"], s8["control_updates"], s8["start_invalid"]) == (15, 16, 0.6)
    assert s8["runs"] == 6 and s8["escaped"] == ["gate", "advantage", "shuffled", "self"]

    lam = f["lambda"]
    assert lam["seed"] == 11 and lam["oracle"]["mean"] == -0.098
    assert lam["chosen"]["gate"] == {"lam": 0.03, "place": 2, "of": 4}
    assert lam["chosen"]["advantage"]["place"] == lam["chosen"]["reverse_kl"]["place"] == 1
    assert (lam["larger"], lam["larger_collapsed"], lam["falls"]) == (8, 3, True)

    assert f["share"]["gate"]["per_seed"] == {5: 0.04, 6: 0.02, 7: 0.02, 8: 0.02, 9: 0.02, 10: 0.02}
    assert f["share"]["gate"]["mean"] == pytest.approx(0.14 / 6) and f["share"]["gate"]["lam"] == 0.03
    assert f["share"]["advantage"]["mean"] == pytest.approx(0.1) and "reverse_kl" not in f["share"]

    # two independent means of 13 x 64 = 832 episodes at p: sd √(p(1 - p)/832 + q(1 - q)/832), RMS over seeds
    var = [(0.25 * 0.75 + (0.25 + d) * (0.75 - d)) / 832 for d in PRIMARY_D]
    assert f["shuffle_noise"]["episodes"] == 832
    assert f["shuffle_noise"]["sd"] == pytest.approx(math.sqrt(sum(var) / 6))

    st = f["starts"]  # P1/s5, s6, s8, s11 and the superseded s5, s6: above 0 at s6 and the lost s5
    assert (st["starts"], st["oracle_above"]) == (6, 2)
    assert (st["own_starts"], st["own_above"], st["own_negative"]) == (4, 1, 2)
    assert st["flips"] == [{"seed": 5, "before": 0.1, "after": -0.1}]  # s6's lost interval holds 0


def test_the_facts_in_words():
    data = hand_study()
    f = study_reading.facts(data)
    text = " ".join(study_reading.reading_lines(data))
    assert text.startswith("**What the data supports**")
    assert "the teacher's term is too small to matter (2.3% to 10.0% of the update where it is logged)" in text
    assert "at 4 of 6 starts the model cannot use even a correct skill; its own skill's gap lies above 0 at 1 " \
           "of 4" in text
    assert f"clause 1 holds {f['power']['reverse_kl']['at_margin']:.2f} of the time at a true +0.05" in text
    assert ("**Clause 5 could not hold once the start of seed 8 existed.** The primary `reverse_kl` collapsed only "
            "at seed 8 (rule 3): the control, which makes no update, trips rule 3 there, its rollouts' "
            "invalid-action share above 0.5 at 15 of 16 updates; the start plays invalid actions 0.600 of the time "
            "(the gap's plain plays); 4 of the 6 runs that update there escape every rule.") in text
    assert ("**λ was chosen at seed 11, where the oracle teacher acts worse than the policy** (its oracle gap −0.098 "
            "[−0.157, −0.038]") in text
    assert "`gate` 0.03 (2 of 4), `advantage` 0.1 (the smallest), `reverse_kl` 0.03 (the smallest)" in text
    assert "of the 8 larger candidates 3 collapsed there, and pool success fell with every step up" in text
    assert "`gate` at λ 0.03 2.3% (2.0% to 4.0% over seeds 5, 6, 7, 8, 9, 10)" in text
    assert "`reverse_kl`, `shuffled`, `self` log none" in text
    ci = data["analysis"]["reverse_kl"]["ci95"]
    assert ci[1] < study.MARGIN and f"The primary `reverse_kl` at +0.05: its interval [{study._signed(ci[0])}, " \
                                      f"{study._signed(ci[1])}] ends below it." in text
    assert "remade on another CPU, seed 5 +0.100 → −0.100" in text


def test_the_answer_comes_first_and_the_deviations_last():
    data = hand_study()
    text = study.docs_section(data)
    assert text.startswith("**The answer: no.** The primary arm `reverse_kl` against GRPO at seeds 5–10: d̄ +0.005")
    assert "clauses 1, 2 and 3 fail, clauses 4 and 5 hold" not in text  # clause 5 fails at seed 8
    assert "clauses 1, 2, 3 and 5 fail, clause 4 holds" in " ".join(text.split())
    assert "1 deviations are recorded, listed at the end of this section" in " ".join(text.split())
    order = [text.index(x) for x in ("**The answer: no.**", "**What the data supports**", "**Study commit**",
                                     "**The criterion, for the primary arm", "**The demo check", "**Deviations** (1)")]
    assert order == sorted(order)
    assert text.rstrip().endswith("- run a: moved (2026-12-06, aaaaaaaaa)")


def test_no_reading_before_an_answer():
    data = hand_study()
    del data["runs"]["sparse/s10/shuffled"]
    data["analysis"] = study.analysis(data)
    assert data["analysis"]["answer"] is None
    assert study_reading.facts(data) is None and study_reading.reading_lines(data) == []
    assert not study.docs_section(data).startswith("**The answer")
