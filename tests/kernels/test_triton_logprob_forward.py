"""Forward kernel of the linear log-prob op (interpreter on CPU) against an fp64 materialized reference."""

import pytest
import torch

from seedfast.kernels import configs
from seedfast.ops import triton_backend as tb
from tests.kernels.triton_reference import INTERPRETER, TOL, assert_close, reference_logprob

pytestmark = INTERPRETER

TILE_V = configs.INTERPRET_FWD["BLOCK_V"]
N, D, V = 45, 40, TILE_V * 4 + 7  # ragged against every tile: 45 = 32 + 13, 40 = 32 + 8, V = 4 tiles + 7


def _inputs(dtype, seed=0, n=N, d=D, vocab=V, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, d, generator=g) * scale).to(dtype)
    weight = (torch.randn(vocab, d, generator=g) / d**0.5 * 3).to(dtype)
    teacher = (torch.randn(n, d, generator=g) * scale).to(dtype)
    targets = torch.randint(0, vocab, (n,), generator=g)
    targets[[i for i in (3, 17, 40) if i < n]] = -100
    return hidden, weight, targets, teacher


def _check(out, ref, rel, with_entropy, with_teacher):
    logprob, entropy, teacher_logprob, lse = out
    ref_lp, ref_ent, ref_teacher, ref_lse = ref
    assert logprob.dtype == torch.float32 and logprob.shape == ref_lp.shape
    assert_close(logprob, ref_lp, rel, "logprob")
    assert_close(lse, ref_lse, rel, "lse")
    if with_entropy:
        assert_close(entropy, ref_ent, rel, "entropy")
    else:
        assert entropy is None
    if with_teacher:
        assert_close(teacher_logprob, ref_teacher, rel, "teacher_logprob")
    else:
        assert teacher_logprob is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_teacher", [False, True])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_forward_matches_fp64(dtype, with_teacher, with_entropy):
    hidden, weight, targets, teacher = _inputs(dtype)
    teacher = teacher if with_teacher else None
    out = tb.forward(hidden, weight, targets, teacher, 0.7, with_entropy, -100)
    ref = reference_logprob(hidden, weight, targets, teacher, 0.7)
    _check(out, ref, TOL[dtype], with_entropy, with_teacher)
    ignored = targets == -100
    assert bool((out[0][ignored] == 0).all())
    if with_entropy:
        assert bool((out[1][ignored] == 0).all()) and bool((out[1][~ignored] > 0).all())


@pytest.mark.parametrize("n_splits", [1, 3, 7])
def test_vocab_splits_merge_exactly(n_splits):
    # 5 vocabulary tiles: 3 splits are uneven (2+2+1 tiles), 7 splits leave two splits empty (m = -inf, s = 0).
    # 70 tokens = 3 token blocks: the last program group (2 token blocks each) is a partial one.
    hidden, weight, targets, teacher = _inputs(torch.float32, seed=1, n=70)
    targets[targets == -100] = 0  # ignore_index=0: a custom ignore index that is a real token id too
    out = tb.forward(hidden, weight, targets, teacher, 1.0, True, 0, n_splits=n_splits, group_n=2)
    ref = reference_logprob(hidden, weight, targets, teacher, 1.0, ignore_index=0)
    _check(out, ref, TOL[torch.float32], True, True)


def test_all_negative_logits_and_padded_columns():
    # Every logit in [-1100, -1000]: an online max started at 0 underflows every exp to 0, and the 57 padded
    # columns of the last tile would add exp(0 - m) each unless masked to -inf.
    g = torch.Generator().manual_seed(2)
    hidden = torch.ones(N, D)
    level = -1000.0 - 100.0 * torch.rand(V, generator=g)
    weight = level[:, None] / D + 0.01 * torch.randn(V, D, generator=g)
    targets = torch.randint(0, V, (N,), generator=g)
    out = tb.forward(hidden, weight, targets, None, 1.0, True, -100)
    ref = reference_logprob(hidden, weight, targets)
    assert float(ref[3].max()) < -900
    _check(out, ref, TOL[torch.float32], True, False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_of_magnitude_1e4(dtype):
    # Integer inputs (|w| <= 253, exact in bf16) make every logit an exact integer, |z| up to 1e4:
    # z[i, v] = ±c_v·d + O(d) for hidden rows ±s with a few flipped signs.
    g = torch.Generator().manual_seed(3)
    sign = torch.randint(0, 2, (D,), generator=g) * 2 - 1
    weight = torch.randint(-250, 251, (V, 1), generator=g) * sign + torch.randint(-3, 4, (V, D), generator=g)
    row_sign = torch.randint(0, 2, (N, 1), generator=g) * 2 - 1
    flips = torch.where(torch.rand(N, D, generator=g) < 0.1, -1, 1)
    hidden = (row_sign * sign * flips).to(dtype)
    weight = weight.to(dtype)
    targets = torch.randint(0, V, (N,), generator=g)
    targets[::4] = (hidden.double() @ weight.double().T).argmax(1)[::4]  # some targets at the max: logprob ~ 0
    out = tb.forward(hidden, weight, targets, hidden.flip(0), 1.0, True, -100)
    ref = reference_logprob(hidden, weight, targets, hidden.flip(0))
    assert float(ref[3].abs().min()) > 5e3
    _check(out, ref, 1e-5, True, True)


def test_vocab_smaller_than_one_tile_and_single_token():
    hidden, weight, targets, _ = _inputs(torch.float32, seed=4, n=1, vocab=7)
    out = tb.forward(hidden, weight, targets, None, 2.0, True, -100)
    _check(out, reference_logprob(hidden, weight, targets, None, 2.0), 1e-5, True, False)


def test_zero_tokens():
    hidden, weight, _, teacher = _inputs(torch.float32, n=0)
    logprob, entropy, teacher_logprob, lse = tb.forward(hidden, weight, torch.zeros(0, dtype=torch.long),
                                                        teacher, 1.0, True, -100)
    assert logprob.shape == entropy.shape == teacher_logprob.shape == lse.shape == (0,)


def test_bad_inputs_raise_one_clear_error():
    hidden, weight, targets, _ = _inputs(torch.float32, n=4)
    bad = targets.clone()
    bad[2] = V
    with pytest.raises(ValueError, match=r"targets\[2\]"):
        tb.forward(hidden, weight, bad, None, 1.0, False, -100)
    with pytest.raises(ValueError, match="same dtype"):
        tb.forward(hidden, weight.bfloat16(), targets, None, 1.0, False, -100)
    with pytest.raises(ValueError, match="teacher_hidden"):
        tb.forward(hidden, weight, targets, hidden[:2], 1.0, False, -100)
    with pytest.raises(ValueError, match="temperature"):
        tb.forward(hidden, weight, targets, None, 0.0, False, -100)
    with pytest.raises(ValueError, match="differ in d"):
        tb.forward(hidden, weight[:, :-1], targets, None, 1.0, False, -100)
