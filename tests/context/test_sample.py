import pytest
import torch

from seedfast.context.sample import StepSample


def ids(*values):
    return list(values)


def test_single_insertion_builds_teacher_prompt_by_hand():
    s = StepSample(prompt_ids=ids(1, 2, 3, 4), response_ids=ids(9), insert_at=2, privileged_ids=ids(7, 8))
    assert s.teacher_prompt_ids().tolist() == [1, 2, 7, 8, 3, 4]
    assert s.insert_at == 2 and s.privileged_ids.tolist() == [7, 8]
    assert s.has_teacher and s.first_edit() == 2


@pytest.mark.parametrize("k, expected", [(0, [7, 1, 2, 3]), (3, [1, 2, 3, 7])])
def test_insertion_at_both_ends(k, expected):
    s = StepSample(prompt_ids=torch.tensor([1, 2, 3]), response_ids=[5], insert_at=k, privileged_ids=[7])
    assert s.teacher_prompt_ids().tolist() == expected
    assert s.first_edit() == k


def test_two_insertion_points_and_a_dropped_span():
    s = StepSample(
        prompt_ids=list(range(10, 20)),
        response_ids=[1],
        insertions=[(2, [91]), (8, [92, 93])],
        teacher_drops=[(2, 5)],
    )
    assert s.teacher_prompt_ids().tolist() == [10, 11, 91, 15, 16, 17, 92, 93, 18, 19]
    assert s.privileged_ids.tolist() == [91, 92, 93]
    assert s.first_edit() == 2


def test_drop_before_the_insertion_moves_the_shared_prefix():
    s = StepSample(prompt_ids=list(range(8)), response_ids=[1], insert_at=6, privileged_ids=[50],
                   teacher_drops=[(2, 4)])
    assert s.first_edit() == 2
    assert s.teacher_prompt_ids().tolist() == [0, 1, 4, 5, 50, 6, 7]


@pytest.mark.parametrize("privileged, valid", [([], True), ([3], False)])
def test_samples_without_teacher(privileged, valid):
    s = StepSample(prompt_ids=[1, 2], response_ids=[3], insert_at=1, privileged_ids=privileged,
                   teacher_valid=valid)
    assert not s.has_teacher
    assert s.first_edit() == 2  # the whole prompt is "shared": there is no second context


def test_no_insertion_at_all_is_a_student_only_sample():
    s = StepSample(prompt_ids=[1, 2], response_ids=[3, 4])
    assert not s.has_teacher and s.insert_at is None and s.privileged_ids.numel() == 0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(insert_at=5, privileged_ids=[1]), "insert_at=5 .* outside the prompt"),
        (dict(insert_at=-1, privileged_ids=[1]), "insert_at=-1 .* outside the prompt"),
        (dict(response_ids=[]), "response_ids is empty"),
        (dict(prompt_ids=[]), "prompt_ids is empty"),
        (dict(insertions=[(3, [1]), (1, [2])]), "must not decrease"),
        (dict(insert_at=2, privileged_ids=[1], teacher_drops=[(1, 3)]), "inside dropped span"),
        (dict(teacher_drops=[(2, 1)]), "teacher_drops"),
        (dict(insert_at=1), "go together"),
        (dict(insert_at=1, privileged_ids=[1], insertions=[(1, [2])]), "not both"),
        (dict(prompt_ids=[[1, 2]]), "prompt_ids must hold ints"),
        (dict(prompt_ids=torch.ones(2, 2, dtype=torch.long)), "must be 1-D"),
        (dict(response_ids=torch.ones(2)), "integer token ids"),
        (dict(response_ids=[-3]), "negative token id"),
    ],
)
def test_bad_input_names_the_sample(kwargs, message):
    base = dict(prompt_ids=[1, 2, 3], response_ids=[4], sample_id="traj7/step2")
    base.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=message) as info:
        StepSample(**base)
    assert "traj7/step2" in str(info.value)
