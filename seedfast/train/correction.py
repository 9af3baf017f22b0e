"""The rollout correction of one update (docs/algorithms.md, 'Rollout correction'): the policy term's per-token weight
from ℓtrain (θ_old's scores of the response tokens) and the log-probs the engine sampled them with, and the
diagnostics every run logs whatever the mode.

`correction_weights` is the one entry point: per-token trainer log-probs packed over the samples' response tokens,
the samples (whose `meta["rollout_logprobs"]` are the behaviour log-probs), the config; it returns the stop-gradient
weight to fold into the update (None with mode none) and a `CorrectionTally` of the diagnostics.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from seedfast.algo.correction import (
    SUM_KEYS,
    CorrectionOptions,
    CorrectionSums,
    correction_metrics,
    merge_sums,
    rollout_correction,
)
from seedfast.config import CorrectionConfig
from seedfast.context.sample import StepSample
from seedfast.distributed.data import DataParallel

PREFIX = "rollout_corr/"
# the gap keeps the names runs have always logged it under (README, docs/pitfalls.md)
_GAP_NAMES = {"gap_mean": "rollout/logprob_gap_mean", "gap_max": "rollout/logprob_gap_max"}


class MaskedShareWarning(UserWarning):
    """The rollout correction masked more of the update than rollout.correction.warn_masked_share."""


def correction_options(correction: CorrectionConfig) -> CorrectionOptions:
    """The algo-side options from the `rollout.correction` config, the one place they are read."""
    return CorrectionOptions(mode=correction.mode, token_clip=correction.token_clip, seq_clip=correction.seq_clip,
                             geo_low=correction.geo_low, geo_high=correction.geo_high,
                             token_low=correction.token_low, token_high=correction.token_high)


@dataclass
class CorrectionTally:
    """The diagnostics' sums over the samples added so far (micro-batches, data-parallel ranks)."""

    sums: CorrectionSums | None = None
    without_logprobs: float = 0.0  # samples left out of the diagnostics: the engine gave no log-probs (mode none)

    def add(self, sums: CorrectionSums) -> None:
        self.sums = merge_sums(self.sums, {k: v.detach().double().cpu() for k, v in sums.items()})

    def reduce(self, dp: DataParallel) -> None:
        """The global sums over the data-parallel ranks (every rank calls it, with or without samples)."""
        own = self.sums or {k: torch.zeros((), dtype=torch.float64) for k in SUM_KEYS}
        keys = [k for k in SUM_KEYS if k != "gap_max"]
        added = dp.sum([self.without_logprobs, *(float(own[k]) for k in keys)])
        self.without_logprobs = added[0]
        sums = {k: torch.tensor(v, dtype=torch.float64) for k, v in zip(keys, added[1:])}
        sums["gap_max"] = torch.tensor(dp.max([float(own["gap_max"])])[0], dtype=torch.float64)
        self.sums = sums

    def metrics(self) -> dict[str, float]:
        out = {PREFIX + "samples_without_logprobs": self.without_logprobs} if self.without_logprobs else {}
        if self.sums is not None:
            out.update({_GAP_NAMES.get(k, PREFIX + k): v for k, v in correction_metrics(self.sums).items()})
        return out


def behaviour_logprobs(samples: Sequence[StepSample], *, required: bool, why: str = "") -> list[torch.Tensor | None]:
    """Each sample's behaviour log-probs (one per response token). A sample without them raises when `required`
    (naming the sample and `why`), else is None; a length that does not match the response always raises."""
    out: list[torch.Tensor | None] = []
    for i, s in enumerate(samples):
        lp = s.meta.get("rollout_logprobs")
        if lp is None:
            if required:
                raise ValueError(f"{why}: {s.describe(i)} carries no behaviour log-probs (the log-probs the engine "
                                 "sampled its response with); the engine must return them, or set "
                                 "rollout.correction.mode=none")
            out.append(None)
            continue
        if lp.shape != (len(s.response_ids),):
            raise ValueError(f"{s.describe(i)}: behaviour log-probs have shape {tuple(lp.shape)}, but the response "
                             f"has {len(s.response_ids)} tokens")
        out.append(lp)
    return out


def trajectory_groups(samples: Sequence[StepSample]) -> torch.Tensor:
    """[S]: one integer per trajectory, shared by its step samples (`meta["trajectory_index"]`, rollout/records.py);
    a sample that names no trajectory is one of its own."""
    ids: dict[object, int] = {}
    out = []
    for i, s in enumerate(samples):
        key = s.meta.get("trajectory_index", ("sample", i))
        out.append(ids.setdefault(key, len(ids)))
    return torch.tensor(out, dtype=torch.long)


def correction_weights(train_logprob: torch.Tensor, samples: Sequence[StepSample], correction: CorrectionConfig,
                       tally: CorrectionTally | None = None) -> tuple[torch.Tensor | None, CorrectionTally]:
    """(weight [N] on train_logprob's device or None with mode none, the tally with these samples added).

    `train_logprob` [N] is packed over the samples' response tokens in sample order. With mode none nothing is
    weighted and samples without behaviour log-probs are counted and left out of the diagnostics; any other mode
    needs every sample's. The seq_* modes weigh a whole trajectory (`rollout.correction.seq_unit`, default) or each
    step sample alone."""
    tally = tally if tally is not None else CorrectionTally()
    options = correction_options(correction)
    lengths = [len(s.response_ids) for s in samples]
    if train_logprob.shape != (sum(lengths),):
        raise ValueError(f"correction_weights: train_logprob has shape {tuple(train_logprob.shape)}, expected "
                         f"({sum(lengths)},) (every response token of the samples)")
    behaviour = behaviour_logprobs(samples, required=options.mode != "none",
                                   why=f"rollout.correction.mode={options.mode}")
    have = [i for i, lp in enumerate(behaviour) if lp is not None]
    tally.without_logprobs += len(samples) - len(have)
    if not have:
        return None, tally
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    width = max(lengths[i] for i in have)
    train = torch.zeros(len(have), width, dtype=torch.float64)
    rollout = torch.zeros_like(train)
    mask = torch.zeros(len(have), width, dtype=torch.bool)
    flat = train_logprob.detach().double().cpu()
    for r, i in enumerate(have):
        n = lengths[i]
        train[r, :n] = flat[starts[i]:starts[i + 1]]
        rollout[r, :n] = behaviour[i].double()
        mask[r, :n] = True
    groups = None
    if options.mode.startswith("seq_") and correction.seq_unit == "trajectory":
        groups = trajectory_groups([samples[i] for i in have])
    result = rollout_correction(train, rollout, mask, options, groups)
    tally.add(result.sums)
    if options.mode == "none":
        return None, tally
    weight = torch.cat([result.weight[r, :lengths[i]] for r, i in enumerate(have)])  # every sample: mode != none
    return weight.to(torch.float32).to(train_logprob.device), tally


def warn_if_masked(metrics: dict[str, float], threshold: float, step: int) -> bool:
    """Warn (once: one call per update) when the correction masked more than `threshold` of the response tokens or of
    the sequences, naming both shares; returns whether it warned."""
    token = metrics.get(PREFIX + "token_masked_share", 0.0)
    seq = metrics.get(PREFIX + "seq_masked_share", 0.0)
    if max(token, seq) <= threshold:
        return False
    warnings.warn(f"step {step}: the rollout correction masked {token:.1%} of the response tokens and {seq:.1%} of "
                  f"the sequences (above rollout.correction.warn_masked_share={threshold:g}); the update learns from "
                  "the rest only. The train/rollout gap is in rollout/logprob_gap_* and rollout_corr/k3_kl",
                  MaskedShareWarning, stacklevel=2)
    return True
