"""At most one logits tile from the LM-head matmul is alive at a time: the previous tile is freed before the
next matmul allocates (two alive doubled the torch backend's peak memory)."""

import weakref

import pytest
import torch

from seedfast.ops import LossOptions, fused_loss, linear_logprob, tiles
from tests.ops.ops_reference import random_problem

N, D, V = 40, 6, 96  # D differs from every tile dimension


@pytest.fixture
def live_tile_counter(monkeypatch):
    """Patch torch.mm to record, at each logits-tile matmul, how many earlier tiles are still alive."""
    real_mm = torch.mm
    tiles_made: list[weakref.ref] = []
    alive_at_call: list[int] = []

    def mm(a, b, *args, **kwargs):
        out = real_mm(a, b, *args, **kwargs)
        if D not in out.shape:  # a logits tile (h·Wᵀ or W·hᵀ), not a [rows, D] gradient
            alive_at_call.append(sum(ref() is not None for ref in tiles_made))
            tiles_made.append(weakref.ref(out))
        return out

    monkeypatch.setattr(torch, "mm", mm)
    monkeypatch.setattr(tiles, "FUSED_MIN_ROWS", 4)
    return alive_at_call


@pytest.mark.parametrize("budget_rows", [8, 16])  # whole-vocabulary blocks of this many rows: single pass
@pytest.mark.parametrize("entropy_coef", [0.0, 0.1])
def test_fused_loss_single_pass(live_tile_counter, monkeypatch, budget_rows, entropy_coef):
    monkeypatch.setenv(tiles.TILE_BYTES_ENV, str(budget_rows * V * 4 * (2 if entropy_coef else 1)))
    hidden, weight, targets = random_problem(N, D, V, seed=0)
    loss, _ = fused_loss(hidden.requires_grad_(), weight.requires_grad_(), targets, token_weights=torch.ones(N) / N,
                         advantages=torch.randn(N), old_logprob=-torch.rand(N) * 5,
                         options=LossOptions(entropy_coef=entropy_coef))
    loss.backward()
    assert len(live_tile_counter) == N // budget_rows + (N % budget_rows > 0)
    assert max(live_tile_counter) == 0


def test_linear_logprob_forward_and_backward(live_tile_counter, monkeypatch):
    monkeypatch.setenv(tiles.TILE_BYTES_ENV, str(16 * 32 * 4))  # 16 x 32 tiles: 3 row blocks x 3 vocab tiles
    hidden, weight, targets = random_problem(N, D, V, seed=1)
    out = linear_logprob(hidden.requires_grad_(), weight.requires_grad_(), targets, with_entropy=True)
    (out.logprob.sum() + out.entropy.sum()).backward()
    assert len(live_tile_counter) > 9  # forward and backward both streamed
    assert max(live_tile_counter) == 0
