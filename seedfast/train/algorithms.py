"""What each RL algorithm does, one frozen AlgorithmSpec per value of the config's `algorithm` (docs/algorithms.md;
docs/architecture.md, 'One RL step, file by file').

A spec says whether the algorithm writes privileged text and with which writer (train/privileged.py), where its
teacher log-probs come from (the OPD term's, or GRSD's scoring pass), whether it needs a judge, how it modulates the
advantages and whether it has a reflection update. The step plan (train/step_plan.py) and the trainer (train/rl.py)
read the spec instead of testing the name; `privileged_text` here calls the spec's writer, so privileged.py, which
holds the writers, never imports this module. What the config must hold for each algorithm is config/loading.py's
ALGORITHM_CHECKS (config may not import train); this module refuses to load unless both tables name exactly the
algorithms the schema allows, so an algorithm added to the schema needs an entry in each.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args, get_type_hints

import torch

from seedfast.algo import grsd as grsd_math
from seedfast.config import Config
from seedfast.config.loading import ALGORITHM_CHECKS
from seedfast.context.sample import StepSample
from seedfast.envs.trajectory import Trajectory
from seedfast.train import privileged
from seedfast.train.privileged import Privileged, WriterContext

# "opd": the OPD term's, from the update's forward or the scoring pass as StepPlan decides (none when
# loss.opd_coef=0); "scorer": always θ_old's scoring pass, before the update (GRSD measures δ there)
TeacherNeed = Literal["none", "opd", "scorer"]


class PrivilegedWriter(Protocol):
    def __call__(self, ctx: WriterContext, trajectories: Sequence[Trajectory]) -> Privileged: ...


# (cfg, samples, scores of the scoring pass, GRPO advantages, trajectories) -> (advantages, metrics)
AdvantageModulation = Callable[[Config, list[StepSample], Any, torch.Tensor, list],
                               tuple[torch.Tensor, dict[str, float]]]


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    privileged: PrivilegedWriter | None = None  # writes the text only the teacher sees; None: no teacher context
    teacher: TeacherNeed = "none"  # where the teacher's log-probs come from
    judge: Callable[[Config], Any] | None = None  # builds the judge the writer scores with, once per run
    # builds the analyzer the writer labels trajectories with, once per run: (cfg, engine, tokenizer) -> analyzer
    analyzer: Callable[[Config, Any, Any], Any] | None = None
    modulate: AdvantageModulation | None = None  # changes the GRPO advantages with the scoring pass's log-probs
    reflection_update: bool = False  # the RL loss on the writer's reflections, after the update

    def __post_init__(self) -> None:
        if self.teacher != "none" and self.privileged is None:
            raise ValueError(f"algorithm {self.name}: a teacher (teacher={self.teacher!r}) needs privileged text")
        if self.modulate is not None and self.teacher != "scorer":
            raise ValueError(f"algorithm {self.name}: modulate reads the scoring pass's teacher log-probs, so it "
                             "needs teacher='scorer'")

    @property
    def opd(self) -> bool:
        """The on-policy distillation term (with loss.opd_coef > 0)."""
        return self.teacher == "opd"


def grsd_modulate(cfg: Config, samples: list[StepSample], scores: Any, advantages: torch.Tensor,
                  trajectories: list) -> tuple[torch.Tensor, dict[str, float]]:
    """Turn-level modulation with δ = mean ℓguide − mean ℓold over the action tokens (docs/algorithms.md, 'GRSD')."""
    if scores.teacher_logprob is None:
        return advantages, {}
    n = len(samples)
    lengths = torch.tensor([len(s.response_ids) for s in samples])
    width = int(lengths.max())
    guide = torch.zeros(n, width)
    old = torch.zeros(n, width)
    mask = torch.zeros(n, width)
    for i in range(n):
        lo, hi = int(scores.offsets[i]), int(scores.offsets[i + 1])
        old[i, : hi - lo] = scores.logprob[lo:hi].cpu()
        guide[i, : hi - lo] = scores.teacher_logprob[lo:hi].cpu()
        mask[i, : hi - lo] = 1
    delta = grsd_math.turn_delta(guide, old, mask)
    groups = grsd_math.contrast_groups([t.won for t in trajectories], [t.meta["group_id"] for t in trajectories])
    # groups whose guidance failed (a sample without the guide) keep Â = A, like groups without contrast
    groups -= {s.group_id for s in samples if not s.has_teacher}
    contrast = torch.tensor([s.group_id in groups for s in samples])
    delta = torch.where(contrast, delta, torch.zeros_like(delta))
    out = grsd_math.modulate(advantages, delta, [s.group_id for s in samples], contrast, lam=cfg.grsd.lam,
                             g_max=cfg.grsd.g_max, eta=cfg.grsd.eta)
    changed = (out != advantages).float().mean()
    return out, {"grsd/modulated_frac": float(changed), "grsd/delta_mean": float(delta[contrast].mean())
                 if bool(contrast.any()) else 0.0}


ALGORITHMS: dict[str, AlgorithmSpec] = {spec.name: spec for spec in (
    AlgorithmSpec("grpo"),
    AlgorithmSpec("seed", privileged=privileged.seed_skills, teacher="opd", analyzer=privileged.run_analyzer),
    AlgorithmSpec("sdar", privileged=privileged.sdar_skills, teacher="opd", analyzer=privileged.sdar_analyzer),
    AlgorithmSpec("grsd", privileged=privileged.grsd_guidance, teacher="scorer", judge=privileged.make_judge,
                  modulate=grsd_modulate, reflection_update=True),
)}


def schema_algorithms() -> tuple[str, ...]:
    """The values the schema allows for `algorithm`."""
    return get_args(get_type_hints(Config)["algorithm"])


def check_tables(allowed: Collection[str], specs: Collection[str], checks: Collection[str]) -> None:
    """Raise unless the spec table and the config's check table name exactly the allowed algorithms."""
    for table, names in (("seedfast/train/algorithms.py ALGORITHMS", specs),
                         ("seedfast/config/loading.py ALGORITHM_CHECKS", checks)):
        if set(names) != set(allowed):
            raise RuntimeError(f"{table} names {sorted(names)} but the schema's algorithm allows {sorted(allowed)}: "
                               "an algorithm needs its spec here and its config check there")


check_tables(schema_algorithms(), ALGORITHMS, ALGORITHM_CHECKS)


def algorithm_spec(name: str) -> AlgorithmSpec:
    """The spec of the algorithm the config names (validation admits only the schema's algorithms)."""
    return ALGORITHMS[name]


def privileged_text(ctx: WriterContext, trajectories: Sequence[Trajectory]) -> Privileged:
    """The privileged text of ctx.cfg.algorithm's writer; none for an algorithm without one."""
    write = algorithm_spec(ctx.cfg.algorithm).privileged
    if write is None:
        return Privileged([None] * len(trajectories), [{} for _ in trajectories])
    return write(ctx, trajectories)
