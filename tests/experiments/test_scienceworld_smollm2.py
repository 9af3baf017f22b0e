"""experiments/scienceworld_smollm2.py's analysis on hand-made records, each expected value computed by hand: the
update count its timing chooses, how a play ended, the held-out summaries, the paired differences and their interval,
the pool's halves, and the analysis the docs quote. No simulator, no model."""

import pytest

from experiments import scienceworld_smollm2 as sw


def play(game: str, won: bool, score: float | None, error: str | None = None) -> dict:
    out = {"game_id": game, "won": won, "steps": 3, "invalid": 0, "actions": ["look around"] * 3, "score": score}
    if error is not None:
        out["error"] = error
    return out


START = [play("a/1[easy]", True, 100), play("a/2[easy]", False, -100), play("b/1[easy]", False, 50),
         play("b/2[easy]", False, None, "timeout: step")]
GRPO = [play("a/1[easy]", True, 100), play("a/2[easy]", True, 100), play("b/1[easy]", False, 25),
        play("b/2[easy]", False, 75)]


def test_updates_fit_the_budget_rounded_down_to_even_and_never_below_the_least():
    assert sw.updates_for(100.0, 3000.0) == 30  # 3000 / 100
    assert sw.updates_for(110.0, 3000.0) == 26  # 27.3 -> 27 -> even 26
    assert sw.updates_for(1000.0, 3000.0) == sw.MIN_UPDATES == 4  # 3 -> 2, raised to 4


def test_a_play_ends_won_lost_errored_or_at_the_step_limit():
    assert [sw.end_of(p) for p in START] == ["won", "lost", "steps", "error"]
    assert sw.task_of("find-non-living-thing/225[easy]") == "find-non-living-thing"


def test_heldout_summary_by_hand():
    s = sw.heldout_summary(START)
    # 1 win in 4; scores 100, -100, 50 (the errored play has none): 50 / 3
    assert s["games"] == 4 and s["wins"] == 1 and s["success"] == 0.25 and s["scored"] == 3
    assert s["mean_score"] == pytest.approx(50 / 3)
    assert s["ends"] == {"error": 1, "lost": 1, "steps": 1, "won": 1}
    assert s["per_task"]["a"] == {"games": 2, "wins": 1, "success": 0.5, "mean_score": 0, "scored": 2,
                                  "ends": {"lost": 1, "won": 1}}
    assert s["per_task"]["b"]["mean_score"] == 50 and s["per_task"]["b"]["scored"] == 1


def test_twin_tasks_answered_alike():
    def twin(task: str, v: int, won: bool, actions: list[str]) -> dict:
        return {**play(f"{task}/{v}[easy]", won, 100 if won else -100), "actions": actions}

    long, short = sw.TWINS
    plays = [twin(long, 1, False, ["go to outside", "focus on baby mouse"]),
             twin(short, 1, True, ["go to outside", "focus on baby mouse"]),  # the same answer: one of the two wins
             twin(long, 2, True, ["focus on elephant"]), twin(short, 2, True, ["focus on mouse"]),
             twin(long, 3, False, ["look around"]), twin(short, 3, False, ["look around"]),  # no focus: not "same"
             twin(long, 4, False, ["focus on bee"])]  # no twin in the other task
    assert sw.twins(plays) == {"pairs": 3, "same_first_focus": 1, "won_one": 1, "won_both": 1}
    assert sw.first_focus(["go to outside"]) is None


def test_paired_differences_by_game_leave_out_a_missing_score():
    assert sw.paired(GRPO, list(reversed(START)), "won") == {"a/1[easy]": 0.0, "a/2[easy]": 1.0, "b/1[easy]": 0.0,
                                                             "b/2[easy]": 0.0}
    # b/2: the start's play failed, no score to pair
    assert sw.paired(GRPO, START, "score") == {"a/1[easy]": 0.0, "a/2[easy]": 200.0, "b/1[easy]": -25.0}
    with pytest.raises(ValueError, match="different games"):
        sw.paired(GRPO[:3], START, "won")
    with pytest.raises(ValueError, match="a game twice"):
        sw.paired(GRPO + GRPO[:1], START + START[:1], "won")


def test_paired_summary_and_its_interval():
    s = sw.paired_summary(GRPO, START, "score", draws=2000)
    # (0 + 200 − 25) / 3; one up, one down, one the same
    assert s["mean"] == pytest.approx(175 / 3) and (s["games"], s["up"], s["down"], s["same"]) == (3, 1, 1, 1)
    lo, hi = s["ci95_bootstrap"]
    assert -25 <= lo < 175 / 3 < hi <= 200
    assert s == sw.paired_summary(GRPO, START, "score", draws=2000)  # fixed by its seed
    same = sw.paired_summary(GRPO, GRPO, "won")
    assert same["mean"] == 0 and same["ci95_bootstrap"] == [0.0, 0.0] and same["same"] == 4


def test_halves_and_the_pool_by_hand():
    h = sw.halves([0.0, 0.5, 0.25, 0.75, 1.0])
    assert h == pytest.approx({"all": 0.5, "first_half": 0.25, "second_half": 2.0 / 3})
    p = sw.pool_summary([0.5, 0.25, 0.75, 0.5], [0.5, 0.5, 0.25, 0.25], 8)
    assert p["grpo"] == pytest.approx({"all": 0.5, "first_half": 0.375, "second_half": 0.625})
    assert p["control"] == pytest.approx({"all": 0.375, "first_half": 0.5, "second_half": 0.25})
    # per update 0, −0.25, 0.5, 0.25
    assert p["grpo_minus_control"] == pytest.approx({"all": 0.125, "first_half": -0.125, "second_half": 0.375})
    assert p["wins"] == {"grpo": 16, "control": 12} and p["episodes"] == 32 and p["first_update_equal"]
    with pytest.raises(ValueError, match="updates"):
        sw.pool_summary([0.5], [0.5, 0.5], 8)


def test_analysis_reads_the_stages_there_and_the_control_plays_as_the_start():
    floor = {"summary": {"episodes": 54, "wins": 0, "success": 0.0, "mean_score": -36.9, "ends": {}},
             "seeds": [0, 1, 2]}
    stages = {"start": {"per_game": START}}
    a = sw.analysis(stages, floor)
    assert set(a) == {"start", "start_twins", "floor"} and a["floor"] == {"episodes": 54, "wins": 0, "success": 0.0,
                                                           "mean_score": -36.9, "seeds": 3}
    stages["grpo"] = {"per_game": GRPO, "episodes_per_update": 8,
                      "per_update": {"train/success_rate": [0.5, 0.25, 0.75, 0.5]}}
    stages["control"] = {"per_update": {"train/success_rate": [0.5, 0.5, 0.25, 0.25]}}
    stages["probe"] = {"candidates": {"oracle_win": {"steps": 10, "delta_mean": 1.5, "share_raised": 0.8,
                                                     "delta_per_token": 0.2, "by_action": {}},
                                      "oracle_fail": {"steps": 0}}}
    a = sw.analysis(stages, None)
    assert a["heldout"]["control"] == a["start"] and a["heldout"]["grpo"]["wins"] == 2
    assert a["heldout"]["success"]["mean"] == 0.25 and a["heldout"]["success"]["up"] == 1
    assert a["pool"]["wins"] == {"grpo": 16, "control": 12}
    assert a["teacher_gap"] == {"oracle_win": {"steps": 10, "delta_mean": 1.5, "share_raised": 0.8,
                                               "delta_per_token": 0.2}}  # a candidate with no steps is left out
