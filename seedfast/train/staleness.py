"""Bounded staleness (docs/architecture.md, 'Asynchronous rollouts'): which policy version rolls out which update,
what the trainer checks and logs about it, and the behaviour log-probs a stale batch learns against.

Versions count updates: the policy before update 0 is version 0, the policy after update s is version s + 1. With
`rollout.max_staleness` N the rollout of update s is produced by version `rollout_version(s)` = max(v0, s − N),
v0 being the version the producer started from (0, or the step a run resumed at when no rollout ahead was kept).
The rule is exact, not "the newest weights the producer has": a run's versions are a function of its config, so a
killed and resumed run (whose checkpoint keeps the rollouts already produced ahead) repeats them, and the bound
s − version ≤ N holds by construction and is checked on every batch.
"""

from __future__ import annotations

import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from seedfast.context.sample import StepSample
from seedfast.rollout.records import RolloutResult

VERSION_KEY = "policy_version"  # Trajectory.meta: the version whose weights generated every token of the episode


class StalenessWarning(UserWarning):
    """Rollouts produced ahead that a resumed run cannot use (the bound changed)."""


class StalenessError(RuntimeError):
    """A batch older than the bound, or from a policy the trainer has not made yet: a bug in the producer's
    bookkeeping, never trained on."""


def rollout_version(step: int, max_staleness: int, first_version: int) -> int:
    """The policy version that rolls out update `step` (the module docstring)."""
    return max(first_version, step - max_staleness)


def versions_needed(first_step: int, first_version: int, max_staleness: int, steps: int) -> list[int]:
    """The versions a producer starting at `first_step` from `first_version` rolls out with, in order, until update
    `steps` - 1: the ones the trainer must send it."""
    return sorted({rollout_version(s, max_staleness, first_version) for s in range(first_step, steps)})


@dataclass
class Produced:
    """One update's rollout as the producer hands it over: the batch, the version that generated it, the
    environment counters of its rollout and when it ran (time.time(), for the overlap the tests check)."""

    step: int
    version: int
    result: RolloutResult
    env_metrics: dict[str, float] = field(default_factory=dict)
    started: float = 0.0
    finished: float = 0.0
    fingerprint: int | None = None  # of the weights it rolled out with (distributed/weight_channel.py fingerprint)


def check_bound(produced: Produced, step: int, max_staleness: int) -> None:
    if produced.step != step:
        raise StalenessError(f"the trainer expected the rollout of update {step}, the producer sent update "
                             f"{produced.step}'s")
    if not 0 <= step - produced.version <= max_staleness:
        raise StalenessError(f"update {step}: rollout from policy version {produced.version}, outside "
                             f"[{step - max_staleness}, {step}] (rollout.max_staleness={max_staleness})")
    for t in produced.result.trajectories:
        if t.meta.get(VERSION_KEY) != produced.version:
            raise StalenessError(f"update {step}: trajectory {t.game_id!r} carries policy version "
                                 f"{t.meta.get(VERSION_KEY)!r}, its batch {produced.version}")


def check_weights(produced: Produced, sent: dict[int, int]) -> None:
    """The producer rolled out with the very weights the trainer sent as its version (when the trainer still knows
    them: a rollout kept ahead in a checkpoint was checked before it was written)."""
    want = sent.get(produced.version)
    if want is not None and produced.fingerprint != want:
        raise StalenessError(f"update {produced.step}: the producer rolled out with weights whose fingerprint "
                             f"{produced.fingerprint} is not that of policy version {produced.version} as sent "
                             f"({want}): the weights it loaded are not the trainer's")


def staleness_metrics(step: int, result: RolloutResult) -> dict[str, float]:
    """Per response token, how many updates old the policy that generated it is (mean and max over the batch), and
    the oldest version: every token carries its trajectory's version."""
    versions = [result.trajectories[r.trajectory_index].meta[VERSION_KEY] for r in result.steps]
    tokens = torch.tensor([len(r.response_ids) for r in result.steps], dtype=torch.float64)
    ages = step - torch.tensor(versions, dtype=torch.float64)
    return {"rollout/staleness_mean": float((ages * tokens).sum() / tokens.sum().clamp_min(1.0)),
            "rollout/staleness_max": float(ages.max()) if len(versions) else 0.0,
            "rollout/policy_version": float(min(versions)) if versions else float(step)}


def behaviour_logprob(samples: list[StepSample]) -> torch.Tensor:
    """ℓbehaviour of every response token, packed in sample order (UpdateBatch's layout): the log-probs the producer
    sampled with. A stale batch's ℓold is these, so the PPO ratio is π_θ / π_behaviour; this is also the input the
    train-vs-rollout mismatch correction takes beside ℓθ_old."""
    parts = []
    for s in samples:
        lp = s.meta.get("rollout_logprobs")
        if lp is None:
            raise StalenessError(f"sample {s.sample_id!r} has no behaviour log-probs (rollout_logprobs): a stale "
                                 "batch needs the log-probs it was sampled with")
        parts.append(lp)
    return torch.cat(parts).float() if parts else torch.zeros(0)


AHEAD_FILE = "rollouts_ahead.pkl"  # in a checkpoint: the rollouts produced before their update (pickled Produced)


def ahead_state(next_step: int, max_staleness: int, ahead: dict[int, Produced]
                ) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A checkpoint's part of staleness: the trainer state's policy version and bound, the steps and versions of the
    rollouts produced ahead (from `next_step` on, consecutive), and those rollouts as a file of their own."""
    kept = []
    while next_step + len(kept) in ahead:
        kept.append(ahead[next_step + len(kept)])
    state = {"policy_version": next_step, "max_staleness": max_staleness,
             "rollouts_ahead": [[p.step, p.version] for p in kept]}
    return state, ({AHEAD_FILE: pickle.dumps(kept)} if kept else {})


def restore_ahead(checkpoint: Path, state: dict[str, Any], max_staleness: int, start: int) -> dict[int, Produced]:
    """The rollouts a checkpoint kept ahead, when it was written under the same bound (the resumed run then repeats
    the interrupted run's versions); under another bound they are dropped, with a warning, and the producer starts
    afresh from the checkpoint's policy."""
    listed = state.get("rollouts_ahead") or []
    if not listed:
        return {}
    if state.get("max_staleness") != max_staleness:
        warnings.warn(f"{checkpoint}: {len(listed)} rollout(s) produced ahead under rollout.max_staleness="
                      f"{state.get('max_staleness')} are dropped (now {max_staleness}); the producer starts from "
                      f"policy version {start}", StalenessWarning, stacklevel=2)
        return {}
    kept = pickle.loads((checkpoint / AHEAD_FILE).read_bytes())
    if [[p.step, p.version] for p in kept] != listed or (kept and kept[0].step != start):
        raise StalenessError(f"{checkpoint / AHEAD_FILE} holds rollouts {[[p.step, p.version] for p in kept]}, "
                             f"its trainer state lists {listed} from update {start}")
    return {p.step: p for p in kept}
