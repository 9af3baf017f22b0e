"""Tile shapes come from the memory budget."""

import pytest

from seedfast.ops import tiles


@pytest.mark.parametrize("n, vocab, d, upcast", [(4096, 32768, 512, False), (4096, 152064, 4096, True),
                                                  (100, 1500, 64, False), (3, 50, 8, False), (0, 10, 4, False)])
@pytest.mark.parametrize("budget", [1 << 20, 8 << 20, 64 << 20])
@pytest.mark.parametrize("live", [1, 2])
def test_tile_fits_budget_and_problem(n, vocab, d, upcast, budget, live):
    rows, cols = tiles.tile_shape(n, vocab, d, upcast, budget, live)
    assert 1 <= rows <= max(n, 1) and 1 <= cols <= vocab
    fp32_bytes = 4 * (live * rows * cols + (cols * d if upcast else 0))
    assert fp32_bytes <= budget
    # The budget is used: either the whole problem fits, or the tile holds at least half the budget.
    assert (rows >= n and cols == vocab) or fp32_bytes >= budget // 2


def test_vocab_is_tiled_only_when_whole_rows_would_make_short_blocks():
    assert tiles.tile_shape(4096, 1500, 64, False, 8 << 20) == (1398, 1500)
    rows, cols = tiles.tile_shape(4096, 152064, 4096, False, 8 << 20)
    assert rows == tiles.PREFERRED_ROWS and cols < 152064


def test_fused_rows():
    assert tiles.fused_rows(4096, 32768, False, 16 << 20) == 128
    assert tiles.fused_rows(4096, 32768, False, 4 << 20) == 0   # 32 rows: not worth it
    assert tiles.fused_rows(4096, 32768, False, 8 << 20) == 64
    assert tiles.fused_rows(4096, 1500, False, 8 << 20) == 1398
    assert tiles.fused_rows(10, 152064, False, 8 << 20) == 10   # a short batch fits whole
    assert tiles.fused_rows(4096, 32768, True, 8 << 20) == 0    # a bf16 weight would need an fp32 copy


def test_budget_from_environment(monkeypatch):
    monkeypatch.delenv(tiles.TILE_BYTES_ENV, raising=False)
    assert tiles.tile_budget_bytes() == tiles.DEFAULT_TILE_BYTES
    monkeypatch.setenv(tiles.TILE_BYTES_ENV, "4096")
    assert tiles.tile_budget_bytes() == 4096
    for bad in ("lots", "0"):
        monkeypatch.setenv(tiles.TILE_BYTES_ENV, bad)
        with pytest.raises(ValueError, match=tiles.TILE_BYTES_ENV):
            tiles.tile_budget_bytes()
