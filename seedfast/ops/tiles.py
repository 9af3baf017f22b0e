"""Tile shapes of the chunked torch backend, chosen from a memory budget rather than fixed constants.

A tile is `rows` tokens × `cols` vocabulary entries of fp32 logits. Tall tiles pay on CPU: the LM-head
weight is streamed once per row block and dW is read-modify-written once per row block, so both costs
fall as `rows` grows, while the GEMM stays efficient for any `cols` of a few hundred or more.
"""

from __future__ import annotations

import os

TILE_BYTES_ENV = "SEEDFAST_OPS_TILE_BYTES"
DEFAULT_TILE_BYTES = 16 << 20
PREFERRED_ROWS = 1024
MIN_COLS = 32
# The single-pass fused loss keeps whole vocabulary rows (3 GEMMs per block instead of 4). Below this
# many rows per block its short, wide GEMMs and the per-block read-modify-write of dW cost more than
# the GEMM it saves, and forward -> token_loss -> backward in tall tiles is used instead. Measured on
# an idle 2-core EPYC at N=4096, d=512, V=32768 (fwd+bwd vs materialized logits, 1 thread): 64 rows
# 0.84x, 128 rows 0.72x.
FUSED_MIN_ROWS = 64


def tile_budget_bytes() -> int:
    """Bytes of fp32 logits one tile may hold (env SEEDFAST_OPS_TILE_BYTES overrides the default)."""
    raw = os.environ.get(TILE_BYTES_ENV)
    if raw is None:
        return DEFAULT_TILE_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{TILE_BYTES_ENV} must be a positive integer number of bytes, got {raw!r}") from None
    if value < 4:
        raise ValueError(f"{TILE_BYTES_ENV} must be at least 4 bytes, got {value}")
    return value


def tile_shape(n_rows: int, vocab: int, hidden_dim: int, upcast_weight: bool, budget_bytes: int,
               live_tiles: int = 1) -> tuple[int, int]:
    """(rows, cols) of a tile. `live_tiles` fp32 tiles are alive at once (2 where the entropy needs
    probabilities beside log-probabilities); when the weight is not fp32 each tile also holds an fp32
    copy of its `cols` weight rows. All of it fits the budget."""
    elems = max(budget_bytes // 4 // live_tiles, 1)
    weight_elems_per_col = hidden_dim if upcast_weight else 0
    target_rows = max(1, min(n_rows, PREFERRED_ROWS))
    cols = elems // (target_rows + weight_elems_per_col)
    cols = max(1, min(vocab, max(MIN_COLS, cols)))
    rows = (elems - cols * weight_elems_per_col) // cols
    rows = max(1, min(max(n_rows, 1), rows))
    return rows, cols


def fused_rows(n_rows: int, vocab: int, upcast_weight: bool, budget_bytes: int, live_tiles: int = 1) -> int:
    """Rows per block of the single-pass fused loss (whole vocabulary rows), or 0 when it does not pay."""
    if upcast_weight:
        return 0
    rows = (budget_bytes // 4 // live_tiles) // max(vocab, 1)
    if rows < min(FUSED_MIN_ROWS, max(n_rows, 1)):
        return 0
    return max(1, min(max(n_rows, 1), rows))
