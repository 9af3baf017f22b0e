"""train/batch.py: the config read into seedfast.context's rules, and the teacher metrics of a batch."""

from types import SimpleNamespace

import pytest

from seedfast.context import skill_segment
from seedfast.rollout.records import StepRecord
from seedfast.train.batch import build_samples
from seedfast.train.privileged import Privileged

# system 0-1, task 2-4, history 5-6 / 7-9, observation 10, instructions 11-12: after_task 5, before_response 11
SEGMENTS = (("system", [1, 1]), ("task", [2, 2, 2]), ("history", [3, 3]), ("history", [3, 3, 3]),
            ("observation", [4]), ("instructions", [5, 5]))


class CharTokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def cfg(max_prompt_length=100, teacher_mode="additive", insertion="after_task", max_skill_tokens=64):
    return SimpleNamespace(rollout=SimpleNamespace(max_prompt_length=max_prompt_length),
                           skill=SimpleNamespace(insertion=insertion, teacher_mode=teacher_mode,
                                                 max_skill_tokens=max_skill_tokens))


def records():
    # trajectory 0: steps 0 and 1; trajectory 1: step 0
    return [StepRecord(SEGMENTS, (7, 7), None, 1.0, 0, t, s, True, True, "stop") for t, s in [(0, 0), (0, 1), (1, 0)]]


PRIVILEGED = Privileged(episode=["go", None], step=[{1: "open"}, {}])
GO, OPEN = skill_segment(CharTokenizer(), "go"), skill_segment(CharTokenizer(), "open")  # 10 and 12 tokens


@pytest.mark.parametrize("teacher_mode, step1", [("additive", [(5, GO), (11, OPEN)]), ("step_priority", [(11, OPEN)])])
def test_where_the_skills_go(teacher_mode, step1):
    samples, metrics = build_samples(cfg(teacher_mode=teacher_mode), records(), PRIVILEGED, CharTokenizer())
    got = [[(at, ids.tolist()) for at, ids in s.insertions] for s in samples]
    assert got == [[(5, GO)], step1, []]
    assert metrics == {"samples/teacher_truncated_rate": 0.0, "samples/teacher_too_long": 0.0,
                       "samples/teacher_dropped_turns": 0.0, "samples/teacher_valid_rate": 2 / 3}


def test_truncation_and_too_long_are_counted():
    # step 0 of trajectory 0: 13 + 10 + 2 = 25 tokens against 20 + 2 = 22: one turn (2) is not enough, two are
    # step 1 (additive): 13 + 22 + 2 = 37 > 22 even without history (8 + 22 + 2 = 32): no teacher, counted
    samples, metrics = build_samples(cfg(max_prompt_length=20), records(), PRIVILEGED, CharTokenizer())
    assert [s.teacher_drops for s in samples] == [((5, 10),), (), ()]
    assert [s.has_teacher for s in samples] == [True, False, False]
    assert metrics == {"samples/teacher_truncated_rate": 1 / 3, "samples/teacher_too_long": 1.0,
                       "samples/teacher_dropped_turns": 2.0, "samples/teacher_valid_rate": 1 / 3}


def test_no_privileged_text_means_no_teacher():
    samples, metrics = build_samples(cfg(), records(), None, CharTokenizer())
    assert not any(s.has_teacher for s in samples) and metrics["samples/teacher_valid_rate"] == 0.0
