"""The demo tells the truth about its teacher: the report and demo_summary.json's `teacher_share` give SEED's
teacher share of the update (`teacher/opd_share`, mean over the updates that log it) and, below
SMALL_TEACHER_SHARE, say that it is too small for SEED to differ from GRPO (docs/demo.md, 'What it measures and why it
is built this way')."""

import json

from seedfast.app.report import SMALL_TEACHER_SHARE, teacher_shares, write_json, write_report

SMALL = "too small for SEED to differ from GRPO"
EV = {"eval/success_rate": 0.5, "eval/invalid_rate": 0.1, "eval/episode_length": 3.0}


def histories(seed_shares):
    grpo = [{"step": i, "train/success_rate": 0.5} for i in range(4)]
    seed = [{"step": i, "train/success_rate": 0.5, "teacher/contrast": 0.1, **(
        {"teacher/opd_share": v} if v is not None else {})} for i, v in enumerate(seed_shares)]
    return {"grpo": grpo, "seed": seed}


def report(tmp_path, h):
    return write_report(tmp_path, h, floor=0.1, before=EV, after={name: EV for name in h}, timings={"sft": 1.0},
                        setup={"seed": 0}).read_text()


def test_a_small_share_is_said_to_make_seed_grpo(tmp_path):
    h = histories([0.004, 0.008, None, 0.006])  # an update that logs no share is left out: mean 0.018 / 3
    shares = teacher_shares(h)
    assert set(shares) == {"seed"}  # GRPO has no teacher
    s = shares["seed"]
    assert abs(s["opd_share"] - 0.006) < 1e-12 and s["too_small"] is True and s["threshold"] == SMALL_TEACHER_SHARE
    sentence = ("SEED's teacher is 0.6% of its update (`teacher/opd_share`, mean over updates): below 5%, too small "
                "for SEED to differ from GRPO. Here SEED is GRPO in effect; a difference between their numbers is the "
                "run's noise, not the teacher.")
    assert s["note"] == sentence
    assert sentence in report(tmp_path, h)
    summary = json.loads(write_json(tmp_path / "demo_summary.json", {"teacher_share": shares}).read_text())
    assert summary["teacher_share"]["seed"]["opd_share"] == s["opd_share"] and SMALL in summary["teacher_share"][
        "seed"]["note"]


def test_a_large_share_is_given_without_the_sentence(tmp_path):
    h = histories([0.2, 0.3, 0.25, 0.25])
    s = teacher_shares(h)["seed"]
    assert abs(s["opd_share"] - 0.25) < 1e-12 and s["too_small"] is False
    assert s["note"] == "SEED's teacher is 25.0% of its update (`teacher/opd_share`, mean over updates)."
    text = report(tmp_path, h)
    assert s["note"] in text and SMALL not in text


def test_the_threshold_is_strict_and_a_form_that_logs_no_share_says_so(tmp_path):
    at = teacher_shares(histories([SMALL_TEACHER_SHARE] * 4))["seed"]
    assert at["too_small"] is False and SMALL not in at["note"]
    full_vocabulary = teacher_shares(histories([None] * 4))["seed"]  # reverse_kl, jsd: teacher/* but no share
    assert full_vocabulary["opd_share"] is None and full_vocabulary["too_small"] is None
    assert full_vocabulary["note"].startswith("SEED's teacher share of the update: not logged")
    assert full_vocabulary["note"] in report(tmp_path, histories([None] * 4))
    assert teacher_shares({"grpo": histories([0.1])["grpo"]}) == {}
