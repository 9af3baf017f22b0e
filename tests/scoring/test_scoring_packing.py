import pytest
import torch

from seedfast.context.sample import StepSample
from seedfast.scoring.packing import (
    pack_branches,
    pack_prefixes,
    pack_single,
    shared_prefix_length,
    split_by_budget,
)


def make(prompt, response, k=None, skill=None, **kw):
    if k is None:
        return StepSample(prompt_ids=prompt, response_ids=response, **kw)
    return StepSample(prompt_ids=prompt, response_ids=response, insert_at=k, privileged_ids=skill, **kw)


@pytest.mark.parametrize("k, expected", [(0, 0), (2, 2), (3, 3), (4, 3)])
def test_shared_prefix_stops_one_short_of_the_prompt_end(k, expected):
    assert shared_prefix_length(make([1, 2, 3, 4], [5], k, [9])) == expected


def test_student_only_sample_shares_all_but_the_last_prompt_token():
    assert shared_prefix_length(make([1, 2, 3, 4], [5, 6])) == 3


def test_branch_packing_by_hand():
    a = make([10, 11, 12, 13], [20, 21, 22], k=2, skill=[90, 91])
    b = make([30, 31], [40], k=2, skill=[92])  # k = |P|: L = 1
    c = make([50, 51, 52], [60, 61])  # no teacher: L = 2
    lengths = [shared_prefix_length(s) for s in (a, b, c)]
    assert lengths == [2, 1, 2]

    prefix = pack_prefixes([a, b, c], lengths)
    assert prefix.input_ids.tolist() == [10, 11, 30, 50, 51]
    assert prefix.cu_seqlens.tolist() == [0, 2, 3, 5] and prefix.cu_seqlens.dtype == torch.int32
    assert prefix.position_ids.tolist() == [0, 1, 0, 0, 1]
    assert prefix.rows.numel() == 0

    branch = pack_branches([a, b, c], lengths, teacher=[True, True, False])
    # students: [12 13 20 21] [31] [52 60]; teachers: [90 91 12 13 20 21] [31 92]
    assert branch.input_ids.tolist() == [12, 13, 20, 21, 31, 52, 60, 90, 91, 12, 13, 20, 21, 31, 92]
    assert branch.cu_seqlens.tolist() == [0, 4, 5, 7, 13, 15]
    assert branch.position_ids.tolist() == [2, 3, 4, 5, 1, 2, 3, 2, 3, 4, 5, 6, 7, 1, 2]
    # rows predicting A: last |A| rows of each branch
    assert branch.rows.tolist() == [1, 2, 3, 4, 5, 6, 10, 11, 12, 14]
    assert branch.targets.tolist() == [20, 21, 22, 40, 60, 61, 20, 21, 22, 40]


def test_single_context_packing():
    packed = pack_single([make([1, 2, 3], [4, 5]), make([6], [7])])
    assert packed.input_ids.tolist() == [1, 2, 3, 4, 6]
    assert packed.position_ids.tolist() == [0, 1, 2, 3, 0]
    assert packed.rows.tolist() == [2, 3, 4] and packed.targets.tolist() == [4, 5, 7]


def test_budget_groups_are_consecutive_and_respect_every_call():
    costs = [(3, 5), (3, 5), (6, 1), (1, 9), (1, 1)]
    assert split_by_budget(costs, 10, ["s"] * 5) == [[0, 1], [2, 3], [4]]
    assert split_by_budget(costs, 100, ["s"] * 5) == [[0, 1, 2, 3, 4]]


def test_budget_errors_name_the_sample():
    with pytest.raises(ValueError, match="sample 'x' needs 12 tokens .* token_budget=10"):
        split_by_budget([(1, 1), (12, 1)], 10, ["sample 0", "sample 'x'"])
    with pytest.raises(ValueError, match="token_budget must be a positive int"):
        split_by_budget([(1, 1)], 0, ["s"])
