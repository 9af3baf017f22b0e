import pytest
import torch

from seedfast.algo import losses

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]


def _batch(seed: int, rows: int = 8, cols: int = 7):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    mask = torch.rand(rows, cols, generator=g) < 0.6
    if rows > 2:
        mask[2] = False  # an empty row (a sample with no response token)
    mask[0, 0] = True
    return values, mask


@pytest.mark.parametrize(("mode", "expected"), [
    ("token-mean", (1 + 2 + 4) / 3),
    ("seq-mean-token-mean", ((1 + 2) / 2 + 4) / 2),
    ("seq-mean-token-sum", ((1 + 2) + 4) / 2),
])
def test_aggregate_by_hand(mode, expected):
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert losses.aggregate(values, mask, mode).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_aggregate_equals_weighted_sum(mode, seed):
    values, mask = _batch(seed)
    weights = losses.aggregation_weights(mask, mode, dtype=torch.float64)
    assert weights.shape == values.shape
    assert (weights[~mask] == 0).all()
    torch.testing.assert_close(losses.aggregate(values, mask, mode), (values * weights).sum())
    # and with global counts
    w_global = losses.aggregation_weights(mask, mode, global_tokens=40, global_seqs=11, dtype=torch.float64)
    torch.testing.assert_close(losses.aggregate(values, mask, mode, global_tokens=40, global_seqs=11),
                               (values * w_global).sum())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("splits", [[8], [1, 7], [3, 3, 2], [1] * 8])
def test_micro_batch_losses_sum_to_the_full_batch_loss(mode, splits):
    values, mask = _batch(3)
    global_tokens = int(mask.sum())
    global_seqs = int(mask.any(dim=1).sum())
    full = losses.aggregate(values, mask, mode)
    parts = [losses.aggregate(v, m, mode, global_tokens=global_tokens, global_seqs=global_seqs)
             for v, m in zip(values.split(splits), mask.split(splits))]
    torch.testing.assert_close(sum(parts), full)


@pytest.mark.parametrize("chunks", [1, 2, 5])
def test_token_mean_is_split_invariant_within_a_packed_row(chunks):
    values, mask = _batch(4, rows=1, cols=23)
    global_tokens = torch.tensor(int(mask.sum()))  # e.g. the result of an all-reduce
    parts = [losses.aggregate(v, m, "token-mean", global_tokens=global_tokens)
             for v, m in zip(values.chunk(chunks, dim=1), mask.chunk(chunks, dim=1))]
    torch.testing.assert_close(sum(parts), losses.aggregate(values, mask, "token-mean"))


def test_each_mode_reads_only_its_own_global_count():
    values, mask = _batch(5)
    seqs = int(mask.any(dim=1).sum())
    torch.testing.assert_close(losses.aggregate(values, mask, "seq-mean-token-sum", global_tokens=1),
                               losses.aggregate(values, mask, "seq-mean-token-sum", global_seqs=seqs))
    torch.testing.assert_close(losses.aggregate(values, mask, "token-mean", global_seqs=1),
                               losses.aggregate(values, mask, "token-mean"))


@pytest.mark.parametrize("mode", MODES)
def test_empty_mask_gives_zero_loss_and_zero_gradient(mode):
    values = torch.randn(3, 4, requires_grad=True)
    loss = losses.aggregate(values, torch.zeros(3, 4, dtype=torch.bool), mode)
    loss.backward()
    assert loss.item() == 0.0
    assert (values.grad == 0).all()


@pytest.mark.parametrize("mode", MODES)
def test_padding_values_are_ignored_even_if_nan(mode):
    values, mask = _batch(6)
    dirty = values.clone()
    dirty[~mask] = float("nan")
    dirty.requires_grad_(True)
    loss = losses.aggregate(dirty, mask, mode)
    loss.backward()
    torch.testing.assert_close(loss, losses.aggregate(values, mask, mode))
    assert torch.isfinite(dirty.grad).all()


def test_aggregation_rejects_bad_inputs():
    with pytest.raises(ValueError, match=r"unknown mode='mean'.*'token-mean', 'seq-mean-token-mean'"):
        losses.aggregate(torch.zeros(2, 3), torch.ones(2, 3), "mean")
    with pytest.raises(ValueError, match=r"mask has shape \(2, 4\) but values has shape \(2, 3\)"):
        losses.aggregate(torch.zeros(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"values must be \[B, T\]"):
        losses.aggregate(torch.zeros(6), torch.ones(6))
    with pytest.raises(ValueError, match="global_tokens must be >= 0"):
        losses.aggregate(torch.zeros(2, 3), torch.ones(2, 3), global_tokens=-1)
    with pytest.raises(TypeError, match="global_seqs must be a number"):
        losses.aggregate(torch.zeros(2, 3), torch.ones(2, 3), "seq-mean-token-sum", global_seqs="4")
