"""Online per-row statistics of logits streamed in vocabulary tiles: running max, Σexp, target logit,
and (optionally) what entropy needs, all in fp32.

The entropy accumulator holds t = Σ exp(z − m)·(z − m), relative to the running max m, so that
H = log s − t/s stays accurate for logits of any magnitude (an unshifted Σ exp·z cancels badly at 1e4).
"""

from __future__ import annotations

import torch


def row_dot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Σ_j x[i, j]·y[i, j] per row, without allocating the product tile."""
    return torch.bmm(x.unsqueeze(1), y.unsqueeze(2)).view(-1)


def in_tile(local_targets: torch.Tensor, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask of rows whose target lies in this tile, target column clamped into the tile)."""
    inside = (local_targets >= 0) & (local_targets < cols)
    return inside, local_targets.clamp(0, cols - 1)


class RowStats:
    def __init__(self, rows: int, device: torch.device, with_entropy: bool) -> None:
        self.max = torch.full((rows,), -torch.inf, dtype=torch.float32, device=device)
        self.sum_exp = torch.zeros(rows, dtype=torch.float32, device=device)
        self.target = torch.zeros(rows, dtype=torch.float32, device=device)
        self.ent_acc = torch.zeros(rows, dtype=torch.float32, device=device) if with_entropy else None

    def update(self, logits: torch.Tensor, local_targets: torch.Tensor) -> None:
        """Fold in one fp32 tile [rows, cols]; overwrites `logits` (it is a scratch buffer)."""
        inside, col = in_tile(local_targets, logits.shape[1])
        picked = logits.gather(1, col.unsqueeze(1)).squeeze(1)
        self.target = torch.where(inside, picked, self.target)

        new_max = torch.maximum(self.max, logits.amax(dim=1))
        rescale = torch.exp(self.max - new_max)  # 0 on the first tile, where max is -inf
        shifted = logits.sub_(new_max.unsqueeze(1))
        if self.ent_acc is None:
            tile_sum = shifted.exp_().sum(dim=1)
        else:
            exps = torch.exp(shifted)
            tile_sum = exps.sum(dim=1)
            # Re-base the old accumulator to the new max: Σe^{z−m'}(z−m') = r·(t + (m − m')·s).
            # On the first tile (s = 0, m = −inf) the product is NaN, hence the where.
            shift = torch.where(self.sum_exp > 0, (self.max - new_max) * self.sum_exp, 0.0)
            self.ent_acc = rescale * (self.ent_acc + shift) + row_dot(exps, shifted)
        self.sum_exp = rescale * self.sum_exp + tile_sum
        self.max = new_max

    def logsumexp(self) -> torch.Tensor:
        return self.max + torch.log(self.sum_exp)

    def entropy(self) -> torch.Tensor:
        if self.ent_acc is None:
            raise RuntimeError("RowStats was built without entropy")
        return torch.log(self.sum_exp) - self.ent_acc / self.sum_exp
