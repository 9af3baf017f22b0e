"""The data-parallel side of a sharded step: which rank rolls out and trains on which groups, and the few scalars
the ranks must agree on (global token and sequence counts, micro-batch counts, metric sums).

Nothing here moves parameters or gradients: FSDP2 and DTensor do that (distributed/parallelize.py). See docs/scaling.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh


def assign_groups(costs: Sequence[float], world: int) -> list[int]:
    """The rank of each group (cost = its tokens): whole groups only, heaviest first onto the least loaded rank
    (ties to the lower rank), so ranks get nearly equal token counts. Deterministic: every rank computes the
    same answer from the same costs."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    load = [0.0] * world
    owner = [0] * len(costs)
    for g in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda k: (load[k], k))
        owner[g] = r
        load[r] += costs[g]
    return owner


def split_whole_groups(items: Sequence[Any], group_of: Sequence[Any], costs: Sequence[float], rank: int,
                       world: int) -> list[Any]:
    """This rank's share of `items`: every item of a group goes to the rank `assign_groups` gives the group (by
    the summed cost of its items); order within the share is the input order."""
    groups = list(dict.fromkeys(group_of))  # first-seen order
    index = {g: k for k, g in enumerate(groups)}
    totals = [0.0] * len(groups)
    for g, c in zip(group_of, costs):
        totals[index[g]] += c
    owner = assign_groups(totals, world)
    return [item for item, g in zip(items, group_of) if owner[index[g]] == rank]


@dataclass
class DataParallel:
    """The data-parallel ranks of one step (the mesh's "dp_shard" dimension): their group, this rank's place,
    and the scalar reductions the loss and the metrics need."""

    rank: int
    size: int
    group: Any = None  # a ProcessGroup; None = the default group

    @classmethod
    def from_mesh(cls, mesh: DeviceMesh) -> DataParallel:
        dp = mesh["dp_shard"]
        return cls(rank=dp.get_local_rank(), size=dp.size(), group=dp.get_group())

    def _reduce(self, values: Sequence[float], op: Any) -> list[float]:
        t = torch.tensor([float(v) for v in values], dtype=torch.float64)
        if self.size > 1:
            dist.all_reduce(t, op=op, group=self.group)
        return t.tolist()

    def sum(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MAX)

    def min(self, values: Sequence[float]) -> list[float]:
        return self._reduce(values, dist.ReduceOp.MIN)

    def union_keys(self, keys: Any) -> list[str]:
        """The sorted union of every rank's `keys` (metric names differ where a rank saw no teacher tokens)."""
        mine = sorted(keys)
        if self.size == 1:
            return mine
        every: list[Any] = [None] * self.size
        dist.all_gather_object(every, mine, group=self.group)
        return sorted(set().union(*every))


# metrics that are already the same on every rank (the update and the rollout correction reduce them) or that are
# this rank's own (wall times): left as they are
_GLOBAL = ("loss/", "optim/", "grsd/", "time/", "memory/", "profile/", "rollout_corr/")


def global_means(dp: DataParallel, metrics: dict[str, float], weight: float,
                 summed: Sequence[str] = ()) -> dict[str, float]:
    """One step's metrics over all data-parallel ranks: the keys in `summed` (counts, throughputs) added, keys
    ending in `_max` the largest, every other key each rank's value weighted by `weight` (e.g. its trajectory
    count); the update's metrics (already global) and wall times are left as they are. A rank lacking a key
    does not count towards it."""
    keys = [k for k in dp.union_keys(metrics) if not k.startswith(_GLOBAL)]
    maxed = [k for k in keys if k.endswith("_max")]
    rest = [k for k in keys if k not in maxed]
    sums = dp.sum([metrics[k] * (1.0 if k in summed else weight) if k in metrics else 0.0 for k in rest]
                  + [weight if k in metrics else 0.0 for k in rest])
    out = dict(metrics)
    for k, v, w in zip(rest, sums[:len(rest)], sums[len(rest):]):
        out[k] = v if k in summed else v / max(w, 1e-12)
    out.update(zip(maxed, dp.max([metrics.get(k, -math.inf) for k in maxed])))
    return out


def balance_samples(dp: DataParallel, samples: Sequence[Any], advantages: torch.Tensor,
                    per_token: dict[str, torch.Tensor | None]) -> tuple[list[Any], torch.Tensor,
                                                                      dict[str, torch.Tensor | None]]:
    """The update's samples spread over the data-parallel ranks by token count (prompt + response: the update's
    forward), after the advantages are computed (per group, on the rank that rolled the group out), so a sample
    may move. `advantages` is per sample; each tensor of `per_token` is packed over the samples' response tokens
    (None: absent). Every rank gets the same answer (the same greedy assignment over the gathered samples) and,
    when there are at least as many samples as ranks, at least one sample."""
    if advantages.shape != (len(samples),):
        raise ValueError(f"balance_samples: advantages must be per sample [{len(samples)}], got "
                         f"{tuple(advantages.shape)}")
    lengths = [len(s.response_ids) for s in samples]
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    devices = {k: t.device for k, t in per_token.items() if t is not None}
    mine = [(s, float(advantages[i]), {k: t[offsets[i]:offsets[i + 1]].cpu() for k, t in per_token.items()
                                       if t is not None}) for i, s in enumerate(samples)]
    every: list[Any] = [None] * dp.size
    dist.all_gather_object(every, mine, group=dp.group)
    flat = [item for part in every for item in part]
    owner = assign_groups([len(s.prompt_ids) + len(s.response_ids) for s, _, _ in flat], dp.size)
    keep = [item for item, r in zip(flat, owner) if r == dp.rank]
    out = {k: (torch.cat([moved[k] for _, _, moved in keep]).to(devices[k]) if k in devices else None)
           for k in per_token}
    return [s for s, _, _ in keep], torch.tensor([a for _, a, _ in keep], dtype=advantages.dtype), out
