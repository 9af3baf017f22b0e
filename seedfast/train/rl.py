"""Stage 2: the RL loop of docs/architecture.md ('One RL step, file by file'), for grpo / sdar / seed / grsd.

    rollout (π_old) → privileged text → step samples → shared-prefix scoring (ℓold, ℓskill) and ℓref
    → advantages (GRSD modulation) → mini-batch updates through the fused loss → metrics → checkpoint

Every step draws its randomness from (run.seed, step) alone, and a checkpoint holds the model, optimizer and
scheduler: a run killed at any moment and resumed reproduces the uninterrupted run's metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seedfast.algo import advantage as adv_math
from seedfast.algo import losses
from seedfast.config import Config
from seedfast.distributed.checkpoint import export_hf, export_peft_adapter
from seedfast.distributed.data import DataParallel, balance_samples, global_means
from seedfast.distributed.parallelize import unsharded
from seedfast.distributed.weight_push import buckets, check_colocated, hf_named_tensors
from seedfast.envs.failures import EnvironmentFailure
from seedfast.envs.slots import counter_delta, counters_of
from seedfast.model import save_hf
from seedfast.model.lora import adapters_disabled, adapters_merged, has_lora
from seedfast.model.peft_io import save_peft_adapter
from seedfast.rollout.agent_loop import run_agent_loop
from seedfast.rollout.colocated import build_rollout
from seedfast.runtime.checkpoint import save_checkpoint
from seedfast.runtime.metrics import MetricsLogger, NullLogger, truncate_metrics
from seedfast.runtime.optim import grad_norm_and_clip
from seedfast.runtime.paths import RunPaths
from seedfast.runtime.placement import check_placement
from seedfast.runtime.precision import DTYPES
from seedfast.runtime.profiling import PhaseTimer, ProfileWindow, mfu
from seedfast.runtime.progress import ProgressBar, shows_progress
from seedfast.runtime.resume import resume_run
from seedfast.runtime.setup import (
    agent_config,
    device_of,
    engine_dtype,
    env_slot_count,
    hf_folder_key,
    load_policy,
    load_run_tokenizer,
    load_tasks,
    load_trainable_policy,
    make_env_slots,
    policy_path,
    rl_optimizer,
    shard_policy,
    vllm_options,
    watch_precision,
)
from seedfast.scoring import Scores, score, score_reference, spread_scores
from seedfast.seeds import analyzer_seed, sampling_seed, step_seed, update_seed
from seedfast.train.algorithms import privileged_text
from seedfast.train.async_ranks import rank_share, wait_together
from seedfast.train.async_rollout import (
    RolloutProducer,
    RolloutProducerError,
    ranks_beside_producer,
    resume_point,
    split_threads,
    take_part,
    trainer_engine,
)
from seedfast.train.batch import build_samples
from seedfast.train.correction import CorrectionTally, correction_weights, warn_if_masked
from seedfast.train.draws import choose_tasks, seed_everything, task_pool
from seedfast.train.evaluate import evaluate_policy, evaluation_tasks
from seedfast.train.privileged import Privileged, WriterContext
from seedfast.train.reflection import reflection_update
from seedfast.train.staleness import (
    Produced,
    ahead_state,
    behaviour_logprob,
    check_bound,
    restore_ahead,
    staleness_metrics,
    versions_needed,
)
from seedfast.train.step_plan import plan_step
from seedfast.train.teacher_evidence import TeacherEvidence
from seedfast.train.update import UpdateBatch, minibatch_loss_backward


class UpdateSkippedWarning(UserWarning):
    """Mini-batches of an update were skipped: the rollout correction masked every token of them."""


def step_fields(metrics: dict[str, float]) -> dict[str, float]:
    """What a step's plain progress line reports (runtime/progress_lines.py)."""
    names = {"success": "train/success_rate", "reward": "train/reward_mean", "loss": "loss/total",
             "tokens/s": "throughput/tokens_per_s"}
    return {short: metrics[key] for short, key in names.items() if key in metrics}


def groups_with_signal(trajectories: list) -> float:
    """Share of groups whose trajectories disagree on the outcome (some won, some lost): only those carry
    an outcome signal for GRPO."""
    outcomes: dict[Any, set[bool]] = {}
    for t in trajectories:
        outcomes.setdefault(t.meta["group_id"], set()).add(bool(t.won))
    return sum(len(v) == 2 for v in outcomes.values()) / max(len(outcomes), 1)


@dataclass(frozen=True)
class StepScores:
    """What the scoring phase of a step gives the rest: the scoring pass under θ_old (None without one), the
    rollout correction's per-token weights, and ℓref (None without a KL term)."""

    scores: Scores | None
    pg_weight: torch.Tensor | None
    ref_logprob: torch.Tensor | None
    # the first mini-batch's samples when the scoring pass left them out (StepPlan.first_minibatch_scores_itself),
    # and the train/rollout diagnostics of the scored samples, which its update forward completes
    first: list[int] | None = None
    tally: CorrectionTally | None = None


SKILLS_PER_STEP = 4


def record_skills(path: Path, step: int, trajectories: list, privileged: Privileged) -> None:
    """Append the privileged text (SEED/SDAR skills, GRSD guidance) of the step's first SKILLS_PER_STEP trajectories,
    a winner among them when there is one: what the teacher read, for a person to look at (one write of whole
    lines; resuming drops the lines of steps not in the checkpoint, as metrics.jsonl does)."""
    chosen = list(range(min(SKILLS_PER_STEP, len(trajectories))))
    winner = next((i for i, t in enumerate(trajectories) if t.won), None)
    if winner is not None and winner not in chosen:
        chosen[-1] = winner
    lines = []
    for i in chosen:
        t = trajectories[i]
        lines.append(json.dumps({"step": step, "game_id": t.game_id, "won": t.won, "actions": t.actions,
                                 "episode": privileged.episode[i],
                                 "steps": privileged.step[i] if privileged.step else {}}))
    path.parent.mkdir(parents=True, exist_ok=True)  # a caller of Trainer.learn alone (benchmarks/step.py)
    with open(path, "a") as f:
        f.write("".join(line + "\n" for line in lines))


class Trainer:
    def __init__(self, cfg: Config, *, policy_dir: str | Path | None = None, run_dir: str | Path | None = None,
                 envs: Any = None):
        """`envs`: environment slots to roll out and evaluate in (a caller's pool, left open by close()); default:
        one pool of env_slot_count slots, built here once for the run and closed by close()."""
        self.cfg = cfg
        self.run_dir = Path(run_dir or cfg.run_dir)
        self.paths = RunPaths(self.run_dir)
        self.device = device_of(cfg)
        # where the producer runs (runtime/placement.py), refused before anything is built: no model loaded, no
        # engine or environment started for a run that cannot go
        check_placement(cfg, self.device)
        start = Path(policy_dir) if policy_dir else policy_path(cfg)
        # `policy` computes (model.dtype); `trained` holds the master weights the optimizer steps and checkpoints
        # save (optim.master_dtype; the same module unless one process computes in a lower dtype: runtime/precision.py)
        self.policy, self.trained, self.masters = load_trainable_policy(cfg, start, self.device)
        self.policy.gradient_checkpointing = cfg.dist.activation_checkpointing  # per decoder block
        # sharded run (dist.strategy=fsdp, under torchrun): FSDP2 before the optimizer sees the parameters
        self.dp: DataParallel | None = shard_policy(cfg, self.policy, self.device)
        self.is_main = self.dp is None or torch.distributed.get_rank() == 0
        self.tokenizer = load_run_tokenizer(cfg, start)
        self.plan = plan_step(cfg)
        self.ref = None
        # with LoRA and no model.ref_path the reference is the policy with its adapters off: no second copy
        self.ref_is_base = self.plan.kl and has_lora(self.policy) and not cfg.model.ref_path
        if self.plan.kl and not self.ref_is_base:
            ref_dir = hf_folder_key("model.ref_path", cfg.model.ref_path) if cfg.model.ref_path else start
            self.ref = load_policy(cfg, ref_dir, self.device, trainable=False).eval()
        self.optimizer, self.scheduler = rl_optimizer(cfg, self.trained)
        self.rounding = watch_precision(cfg, self.optimizer, self.masters)
        skipped: list[str] = []  # env.damaged_games=skip: games left out, counted in every step's metrics
        self.train_tasks = task_pool(load_tasks(cfg, "train", skipped=skipped), cfg.rollout.task_pool, cfg.run.seed)
        self.games_skipped = float(len(skipped))
        self.eval_tasks = evaluation_tasks(cfg, "eval")  # what `seedfast eval` plays: sizes the slots below
        self.own_envs = envs is None
        self.envs = make_env_slots(cfg, env_slot_count(cfg, len(self.eval_tasks))) if envs is None else envs
        self.env_metrics: dict[str, float] = {}
        self.agent_config = agent_config(cfg, n=cfg.rollout.n, temperature=cfg.rollout.temperature)
        make_judge = self.plan.algorithm.judge
        self.judge = make_judge(cfg) if make_judge is not None else None
        engine = trainer_engine(cfg)  # with a rollout producer, the own engine over the live policy (analysis only)
        if engine == "vllm":  # one engine per rank, on the rank's GPU, fed the policy's weights
            check_colocated(self.dp.world if self.dp is not None else 1, cfg.rollout.tensor_parallel)
        self.rollout_dtype = engine_dtype(cfg)
        self.engine = build_rollout(engine, self.policy, start, seed=cfg.run.seed, dtype=self.rollout_dtype,
                                    sleep=cfg.rollout.vllm_sleep, lora_sync=cfg.rollout.lora_sync, **vllm_options(cfg))
        # asynchronous RL (train/async_rollout.py): a producer process rolls out ahead, at most max_staleness updates
        self.max_staleness = cfg.rollout.max_staleness
        self.start_dir = start
        self.producer: RolloutProducer | None = None
        self.producer_runs = False  # on every rank: global rank 0 owns a producer (its waits are everyone's)
        self.threads_before: int | None = None  # the intra-op threads before the producer took its share of them
        self.ahead: dict[int, Produced] = {}  # rollouts read from the producer before their update
        self.versions_to_send: set[int] = set()
        make_analyzer = self.plan.algorithm.analyzer
        self.analyzer = make_analyzer(cfg, self.engine, self.tokenizer) if make_analyzer is not None else None
        self.sync_metrics: dict[str, float] = {}
        self.n_params = sum(p.numel() for p in self.policy.parameters())
        self.bad_steps = 0
        self.step = 0
        self.log = None

    # ------------------------------------------------------------------ one RL step

    def rl_step(self, step: int) -> dict[str, float]:
        timer = PhaseTimer()
        seed_everything(step_seed(self.cfg.run.seed, step))
        if self.max_staleness == 0:
            result = self.rollout(step, timer)
            return self.learn(step, result, timer)
        with timer.phase("rollout_wait"):  # the producer's batch for this update, produced while we learned
            produced = self._produced(step)
        check_bound(produced, step, self.max_staleness)
        result, self.env_metrics = produced.result, produced.env_metrics
        if self.dp is not None:  # this rank's whole groups, as the synchronous loop splits its tasks
            result, self.env_metrics = rank_share(result, produced.env_metrics, self.dp.rank, self.dp.size)
        metrics = self.learn(step, result, timer, behaviour_old=produced.version < step)
        metrics.update(staleness_metrics(step, produced.result))  # of the whole batch: the same on every rank
        metrics.update({"time/rollout_started_at": produced.started, "time/rollout_finished_at": produced.finished,
                        "time/learned_at": time.time()})
        if step + 1 in self.versions_to_send:
            metrics.update(self._push(step + 1))
        return metrics

    def _produced(self, step: int) -> Produced:
        """Update `step`'s batch: kept ahead, or the producer's; under torchrun rank 0 reads it and every rank gets
        it whole (train/async_ranks.py)."""
        def fetch(wait_s: float | None, since: float) -> Produced | None:
            if step in self.ahead:
                return self.ahead.pop(step)
            return self._producer().next(step, wait_s=wait_s, since=since)

        return wait_together(fetch if self.is_main else None, self.dp)

    def _push(self, version: int) -> dict[str, float]:
        """Send the policy as `version`: rank 0 over the weight channel, every other rank taking part in the gathers
        of the sharded tensors, one full tensor at a time."""
        if self.dp is None:
            return self._producer().push(self.policy, version)
        # the producer's start can take minutes: wait for it in heartbeats, then gather; then its word that it
        # holds the version, in heartbeats too (rank 0 alone waits for it; the others would sit in their next
        # collective)
        wait_together(self._producer_ready if self.is_main else None, self.dp)
        metrics: dict[str, float] = {}
        if self.is_main:
            metrics = self._producer().push(self.policy, version, wait=False)
        else:
            take_part(self.cfg, self.policy)  # the gathers of what rank 0 sends (LoRA: maybe the adapters alone)
        wait_together(functools.partial(self._producer_received, version) if self.is_main else None, self.dp)
        return metrics

    def _producer_received(self, version: int, wait_s: float | None, since: float) -> bool | None:
        return self._producer().received(version, wait_s, since)

    def _producer_ready(self, wait_s: float | None, since: float) -> bool | None:
        return self._producer().ready(wait_s=wait_s, since=since)

    def rollout(self, step: int, timer: PhaseTimer) -> Any:
        cfg = self.cfg
        tasks = choose_tasks(self.train_tasks, cfg.rollout.tasks_per_batch, cfg.run.seed, step)
        if self.dp is not None:  # whole tasks, so a group never straddles ranks
            tasks = tasks[self.dp.rank::self.dp.size]
        self.policy.eval()
        self.engine.begin_step(self._sampling_seed(step))
        # vLLM: wake and push the weights (a collective per tensor); the own engine reads the policy itself
        weights = () if self.engine.reads_policy else buckets(
            hf_named_tensors(self.policy, dtype=DTYPES[self.rollout_dtype]), cfg.rollout.sync_bucket_mb << 20)
        with timer.phase("sync"):
            self.sync_metrics = self.engine.before_rollout(weights)
        before = counters_of(self.envs)
        with timer.phase("rollout"), self._generating():
            result = run_agent_loop(self.engine, self.tokenizer, tasks, self.envs, self.agent_config)
        # worker restarts, environments replayed, failures by kind (envs/workers.py): none is silently dropped
        self.env_metrics = counter_delta(before, counters_of(self.envs), "rollout/env_")
        return result

    def _sampling_seed(self, step: int) -> int:
        """The step's sampling seed on this data-parallel rank (seeds.sampling_seed)."""
        return sampling_seed(self.cfg.run.seed, step, 0 if self.dp is None else self.dp.rank)

    def _generating(self) -> Any:
        """The own engine generates with the policy itself: every FSDP2 unit gathered for the duration; vLLM
        generates with its pushed copy."""
        return unsharded(self.policy) if self.engine.reads_policy else contextlib.nullcontext()

    def learn(self, step: int, result: Any, timer: PhaseTimer, behaviour_old: bool = False) -> dict[str, float]:
        """Everything after the rollout: privileged text, samples, scoring, advantages, update. `behaviour_old`: the
        batch comes from an older policy than this one (asynchronous RL), so ℓold is its behaviour log-probs."""
        # the analyzer's draws start afresh (seeds.analyzer_seed), whatever the rollout drew
        self.engine.begin_step(analyzer_seed(self.cfg.run.seed, step, 0 if self.dp is None else self.dp.rank))
        self.policy.eval()
        trajectories = result.trajectories
        metrics: dict[str, float] = {f"rollout/{k}": float(v) for k, v in result.stats.as_dict().items()}
        metrics.update(self.env_metrics)
        metrics["rollout/games_skipped"] = self.games_skipped
        group_of = [t.meta["group_id"] for t in trajectories]
        privileged = self._privileged(step, trajectories, group_of, timer, metrics)
        samples = self._step_samples(step, result.steps, privileged, timer, metrics)
        scored = self._scores(samples, timer, metrics)
        advantages = self._advantages(samples, scored, trajectories, timer, metrics)
        batch, use_opd, evidence = self._update_batch(samples, advantages, scored, behaviour_old)
        lr_used = self._learn_from(batch, use_opd, evidence, privileged, group_of, timer, metrics, scored)
        return self._step_metrics(step, result, batch.samples, lr_used, timer, metrics)

    def _privileged(self, step: int, trajectories: list, group_of: list, timer: PhaseTimer,
                    metrics: dict[str, float]) -> Privileged | None:
        """The algorithm's privileged text (skills, guidance) for the step's trajectories; None without one."""
        if not self.plan.privileged_text:
            return None
        with timer.phase("analyze"), self._generating():
            ctx = WriterContext(self.cfg, self.engine, self.tokenizer, group_of=group_of, judge=self.judge,
                                analyzer=self.analyzer, step=step)
            privileged = privileged_text(ctx, trajectories)
        metrics.update(privileged.metrics)
        if self.is_main:
            record_skills(self.paths.skills, step, trajectories, privileged)
        return privileged

    def _step_samples(self, step: int, records: list, privileged: Privileged | None, timer: PhaseTimer,
                      metrics: dict[str, float]) -> list:
        """The engine set aside for the update, then the step's samples (train/batch.py); none is a failure."""
        with timer.phase("sync"):  # vLLM sleeps through scoring and the update (its memory is theirs)
            metrics.update({**self.sync_metrics, **self.engine.after_rollout()})
        samples, sample_metrics = build_samples(self.cfg, records, privileged, self.tokenizer)
        metrics.update(sample_metrics)
        if not samples:
            raise EnvironmentFailure(f"step {step}: the rollout produced no step samples "
                                     f"({self._env_failures()})")
        return samples

    def _scores(self, samples: list, timer: PhaseTimer, metrics: dict[str, float]) -> StepScores:
        """The scoring pass under θ_old (ℓold, the teacher's ℓskill), its correction weights, and ℓref."""
        cfg = self.cfg
        with timer.phase("score"):
            scores, first, tally = None, None, None
            if self.plan.score_pass:
                first = self._first_minibatch(len(samples)) if self.plan.first_minibatch_scores_itself else None
                left_out = set(first or ())
                scored = [s for i, s in enumerate(samples) if i not in left_out]
                if scored:
                    # ranks run different numbers of micro-batches: no collectives; a LoRA policy scores with the
                    # merged weights its rollout generated with (model/lora.py adapters_merged, still cached)
                    with unsharded(self.policy), adapters_merged(self.policy):
                        scores = score(self.policy, scored, token_budget=cfg.trainer.micro_batch_tokens,
                                       temperature=cfg.rollout.temperature,
                                       keep_teacher_hidden=self._keeps_teacher_hidden())
                if first is not None:
                    # the first mini-batch's tokens: placeholders its own update forward replaces
                    _, tally = correction_weights(scores.logprob, scored, cfg.rollout.correction) if scores else (
                        None, CorrectionTally())
                    scores = spread_scores(scores, samples, first, with_teacher=self.plan.teacher == "scorer")
            # the rollout correction (docs/algorithms.md, 'Rollout correction'): ℓold against the engine's log-probs;
            # without a scoring pass (on-policy, mode none) the update's forward gives the diagnostics, and the first
            # mini-batch's forward adds its samples' to the scored ones' (`tally`) when it scores itself
            pg_weight = None
            if scores is not None and first is None:
                pg_weight, tally = correction_weights(scores.logprob, samples, cfg.rollout.correction)
                if self.dp is not None:
                    tally.reduce(self.dp)
                metrics.update(tally.metrics())
            ref_lp = None
            if self.ref_is_base:
                with unsharded(self.policy), adapters_disabled(self.policy):
                    ref_lp = score_reference(self.policy, samples, token_budget=cfg.trainer.micro_batch_tokens,
                                             temperature=cfg.rollout.temperature).logprob
            elif self.ref is not None:
                ref_lp = score_reference(self.ref, samples, token_budget=cfg.trainer.micro_batch_tokens,
                                         temperature=cfg.rollout.temperature).logprob
        return StepScores(scores, pg_weight, ref_lp, first, tally)

    def _first_minibatch(self, n: int) -> list[int]:
        """The samples of the update's first mini-batch: `_update`'s first draw of its order."""
        gen = torch.Generator().manual_seed(update_seed(self.cfg.run.seed, self.step))
        return sorted(torch.randperm(n, generator=gen).tolist()[:math.ceil(n / self.cfg.trainer.mini_batches)])

    def _keeps_teacher_hidden(self) -> bool:
        """A full-vocabulary teacher term scored under θ_old needs the teacher's hidden rows (N × d) from the scoring
        pass; scored in the update, it takes them from the update's own forward."""
        return (self.plan.opd and self.plan.teacher != "update"
                and self.cfg.loss.opd_mode in losses.DIVERGENCE_MODES)

    def _advantages(self, samples: list, scored: StepScores, trajectories: list, timer: PhaseTimer,
                    metrics: dict[str, float]) -> torch.Tensor:
        """GRPO advantages with the step penalty, modulated where the algorithm does (GRSD)."""
        cfg = self.cfg
        with timer.phase("advantage"):
            rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
            penalties = torch.tensor([s.penalty for s in samples], dtype=torch.float32)
            groups = [s.group_id for s in samples]
            advantages = adv_math.grpo_with_penalty(rewards + penalties, penalties, groups, norm=cfg.loss.adv_norm,
                                                    eps=cfg.loss.adv_eps, penalty_mode=cfg.loss.step_penalty)
            modulate = self.plan.algorithm.modulate
            if modulate is not None:
                advantages, modulate_metrics = modulate(cfg, samples, scored.scores, advantages, trajectories)
                metrics.update(modulate_metrics)
        metrics["train/reward_mean"] = float(rewards.mean())
        metrics["train/groups_with_signal"] = groups_with_signal(trajectories)
        metrics["train/advantage_zero_frac"] = float((advantages == 0).float().mean())
        return advantages

    def _update_batch(self, samples: list, advantages: torch.Tensor, scored: StepScores,
                      behaviour_old: bool) -> tuple[UpdateBatch, bool, TeacherEvidence | None]:
        """The update's batch (this rank's share under data parallelism), whether it distils from the teacher
        (OPD), and the teacher's evidence it gathers when it does."""
        scores, pg_weight = scored.scores, scored.pg_weight
        teacher_in_update = self.plan.teacher == "update"
        use_opd = self.plan.opd and (teacher_in_update or (scores is not None and scores.teacher_mask is not None))
        from_scores = use_opd and not teacher_in_update
        per_token = {"old": scores.logprob if scores is not None else None, "ref": scored.ref_logprob,
                     "pg_weight": pg_weight, "teacher": scores.teacher_logprob if from_scores else None,
                     "teacher_mask": scores.teacher_mask if from_scores else None,
                     "teacher_hidden": scores.teacher_hidden if from_scores else None}
        if behaviour_old and pg_weight is None:  # π_θ / π_behaviour in the PPO ratio (train/staleness.py)
            per_token["old"] = behaviour_logprob(samples)
        # with a correction mode a stale batch keeps ℓold = θ_old's scores and the weight π_θold / π_behaviour carries
        # the staleness (decoupled PPO: docs/architecture.md, 'Asynchronous rollouts')
        # the teacher's evidence (train/teacher_evidence.py): Δ on winners and losers where both sides were scored
        # under θ_old (here), or the first time the update's forward scores them (there)
        evidence = TeacherEvidence()
        if from_scores:
            evidence.add_contrast(scores.logprob, scores.teacher_logprob, scores.teacher_mask, samples)
        if self.dp is not None:  # the update's samples spread over the ranks by token count
            samples, advantages, per_token = balance_samples(self.dp, samples, advantages, per_token)
        batch = UpdateBatch(samples, advantages, per_token["old"], ref_logprob=per_token["ref"],
                            teacher_logprob=per_token["teacher"], teacher_mask=per_token["teacher_mask"],
                            teacher_from_forward=teacher_in_update, pg_weight=per_token["pg_weight"],
                            teacher_hidden=per_token["teacher_hidden"], diagnose_in_update=scores is None)
        return batch, use_opd, evidence if use_opd else None

    def _learn_from(self, batch: UpdateBatch, use_opd: bool, evidence: TeacherEvidence | None,
                    privileged: Privileged | None, group_of: list, timer: PhaseTimer,
                    metrics: dict[str, float], scored: StepScores | None = None) -> float:
        """The mini-batch updates (each optimizer step advances the schedule: `_update`), and the reflection update
        where the algorithm has one; returns the learning rate of the update's first optimizer step."""
        self.policy.train()
        with timer.phase("update"):
            out = self._update(batch, use_opd=use_opd, evidence=evidence, scored=scored)
            metrics.update(out)
            if out.get("train/skipped_all_masked"):
                self._say_skipped(int(out["train/skipped_all_masked"]), int(out["optim/updates_applied"]))
            if self.plan.reflection_update and privileged is not None and privileged.reflections is not None:
                # GRSD's reflection step steps the same optimizer but is not a step of the schedule (it counts the
                # mini-batch steps: trainer.steps x ppo_epochs x mini_batches, runtime/setup.py rl_optimizer): it
                # runs at the lr of the update's last mini-batch step, as it ran at the update's lr when the
                # schedule stepped once per update, and leaves the scheduled lr of the next step as it was
                scheduled = [group["lr"] for group in self.optimizer.param_groups]
                for group in self.optimizer.param_groups:  # one group (rl_optimizer)
                    group["lr"] = out["optim/lr_last"]
                try:
                    metrics.update(reflection_update(self.cfg, self.policy, self.optimizer, privileged.reflections,
                                                     group_of, self.dp))
                finally:
                    for group, lr in zip(self.optimizer.param_groups, scheduled):
                        group["lr"] = lr
        if self.rounding is not None and self.rounding.last is not None:
            metrics["optim/rounded_away"] = self.rounding.last
        return out["optim/lr"]

    def _step_metrics(self, step: int, result: Any, samples: list, lr_used: float, timer: PhaseTimer,
                      metrics: dict[str, float]) -> dict[str, float]:
        """The step's metrics: outcomes, throughput and phase times, reduced over the ranks under data
        parallelism. `samples`: the ones this rank's update learned from."""
        cfg = self.cfg
        trajectories = result.trajectories
        n_tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
        total_time = sum(timer.seconds.values())
        metrics.update(timer.metrics())
        metrics.update({
            "train/success_rate": sum(t.won for t in trajectories) / max(len(trajectories), 1),
            "train/episode_length": sum(len(t.steps) for t in trajectories) / max(len(trajectories), 1),
            "train/samples": float(len(samples)),
            "throughput/tokens_per_s": n_tokens / max(total_time, 1e-9),
            "optim/lr": lr_used,
        })
        if self.dp is not None:  # this rank's rollout and samples -> the step's, over all ranks
            counts = [f"rollout/{k}" for k in result.stats.as_dict() if not k.endswith("_rate")]
            metrics = global_means(self.dp, metrics, weight=len(trajectories), summed=[
                *counts, *self.env_metrics, "train/samples", "samples/teacher_too_long",
                "samples/teacher_dropped_turns", "throughput/tokens_per_s"])
            for rate, num, den in (("success_rate", "won", "trajectories"),
                                   ("invalid_rate", "invalid_actions", "steps")):
                if f"rollout/{rate}" in metrics:
                    metrics[f"rollout/{rate}"] = metrics[f"rollout/{num}"] / max(metrics[f"rollout/{den}"], 1.0)
        # the shares are global (reduced over the ranks) by now; rank 0 says it, once per update
        if self.is_main and warn_if_masked(metrics, cfg.rollout.correction.warn_masked_share, step):
            metrics["rollout_corr/masked_share_warning"] = 1.0
        if torch.cuda.is_available():
            metrics["memory/peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
            util = mfu(self.n_params, n_tokens / max(timer.seconds.get("update", 0.0), 1e-9))
            if util is not None:
                metrics["throughput/mfu_update"] = util
        return metrics

    def _update(self, batch: UpdateBatch, use_opd: bool, evidence: TeacherEvidence | None,
                scored: StepScores | None = None) -> dict[str, float]:
        """The update's mini-batch steps, the schedule advanced after each optimizer step. Metrics: the last
        mini-batch's loss terms, optim/lr and optim/lr_last (the lr of the first and of the last optimizer step;
        with none, the lr the next one would take), and the spread of the probability ratio per mini-batch k
        (epoch x mini_batches + its place in the epoch, in the order they step): ratio/mb{k}_min, _max, _clip_frac,
        and ratio/moved_min / moved_max over the mini-batches after the first optimizer step (θ moved from θ_old:
        the ratios that can differ from 1), absent with one optimizer step."""
        cfg = self.cfg
        n = len(batch.samples)
        gen = torch.Generator().manual_seed(update_seed(cfg.run.seed, self.step))
        out: dict[str, float] = {}
        if batch.kept is not None:  # a correction mode: mini-batches it masked whole (docs/algorithms.md)
            out["train/skipped_all_masked"] = 0.0
        applied = 0
        lrs: list[float] = []  # the lr of each optimizer step (a resumed lr shows at once)
        moved: list[tuple[float, float]] = []  # (ratio_min, ratio_max) of the mini-batches after the first step
        first = scored.first if scored is not None else None
        if first is not None:  # the first mini-batch scores itself: ℓold = sg(ℓθ), ℓskill from its prefix KV (θ_old)
            first_batch = dataclasses.replace(batch, old_logprob=None, teacher_logprob=None, teacher_mask=None,
                                              teacher_hidden=None, teacher_from_forward=use_opd,
                                              diagnose_in_update=True)
        for epoch in range(cfg.trainer.ppo_epochs):
            order = torch.randperm(n, generator=gen).tolist()
            size = math.ceil(n / cfg.trainer.mini_batches)
            starts = range(0, n, size) if self.dp is None else range(0, size * cfg.trainer.mini_batches, size)
            for j, start in enumerate(starts):  # sharded: mini_batches steps on every rank, whatever its samples
                index = sorted(order[start:start + size])
                if batch.kept is not None and self._all_masked(batch, index):
                    # nothing of it enters any term: no forward, no optimizer step (Adam's moments and the weight
                    # decay would still move the policy on a zero gradient)
                    out["train/skipped_all_masked"] += 1
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                scores_itself = first is not None and epoch == 0 and j == 0
                if scores_itself and index != first:
                    raise RuntimeError(f"update {self.step}: the first mini-batch is {index[:8]}..., the scoring pass "
                                       f"left out {first[:8]}...: their orders differ")
                loss, m = minibatch_loss_backward(
                    self.policy, first_batch if scores_itself else batch, index, cfg.loss, use_kl=self.plan.kl,
                    use_opd=use_opd, temperature=cfg.rollout.temperature,
                    token_budget=cfg.trainer.micro_batch_tokens, dp=self.dp, evidence=evidence,
                    first_look=epoch == 0, correction=scored.tally if scores_itself else None)
                norm = grad_norm_and_clip(self.optimizer, cfg.optim.grad_clip)
                if not (math.isfinite(loss) and math.isfinite(norm)):
                    self.optimizer.zero_grad(set_to_none=True)
                    self.bad_steps += 1
                    out["train/skipped_nonfinite"] = out.get("train/skipped_nonfinite", 0) + 1
                    continue
                self.bad_steps = 0
                lrs.append(self.optimizer.param_groups[0]["lr"])
                self.optimizer.step()
                self.scheduler.step()  # the schedule counts optimizer steps: a skipped mini-batch advances nothing
                applied += 1
                out.update({(k if "/" in k else f"loss/{k}"): v for k, v in m.items()})
                out["loss/total"] = loss
                out["optim/grad_norm"] = norm
                k = epoch * cfg.trainer.mini_batches + j
                for name in ("ratio_min", "ratio_max", "clip_frac"):  # global under data parallelism already
                    if name in m:
                        out[f"ratio/mb{k}_{name.removeprefix('ratio_')}"] = m[name]
                if applied > 1 and "ratio_min" in m:
                    moved.append((m["ratio_min"], m["ratio_max"]))
        out["optim/updates_applied"] = float(applied)
        now = self.optimizer.param_groups[0]["lr"]
        out["optim/lr"], out["optim/lr_last"] = (lrs[0], lrs[-1]) if lrs else (now, now)
        if moved:
            out["ratio/moved_min"] = min(lo for lo, _ in moved)
            out["ratio/moved_max"] = max(hi for _, hi in moved)
        if evidence is not None:
            if self.dp is not None:
                evidence.reduce(self.dp)
            out.update(evidence.metrics())
        if self.bad_steps >= cfg.trainer.max_bad_steps:
            raise FloatingPointError(
                f"{self.bad_steps} non-finite updates in a row (trainer.max_bad_steps={cfg.trainer.max_bad_steps})")
        return out

    def _say_skipped(self, skipped: int, applied: int) -> None:
        """One line (a warning, and an `update_skipped` event in metrics.jsonl) for mini-batches the rollout correction
        masked whole. The lr schedule counts optimizer steps, so it does not advance for them: the next step takes
        the lr this one would have taken."""
        if not self.is_main:
            return
        what = "the whole update" if applied == 0 else f"{skipped} of its mini-batch steps"
        warnings.warn(f"update {self.step}: the rollout correction masked every response token of {skipped} "
                      f"mini-batch{'es' if skipped > 1 else ''}: {what} skipped (no optimizer step; the lr schedule "
                      "not advanced); see rollout_corr/* and train/skipped_all_masked", UpdateSkippedWarning,
                      stacklevel=2)
        if self.log is not None:
            self.log.event({"event": "update_skipped", "update": self.step, "reason": "all_masked",
                            "mini_batches_skipped": skipped, "optimizer_steps": applied,
                            "lr_next": self.optimizer.param_groups[0]["lr"]})

    def _all_masked(self, batch: UpdateBatch, index: list[int]) -> bool:
        """The rollout correction gave every response token of the mini-batch weight 0 (on every data-parallel rank:
        the ranks decide together, so their collectives stay paired)."""
        kept = float(batch.kept_tokens(index))
        if self.dp is not None:
            kept = self.dp.sum([kept])[0]
        return kept == 0

    # ------------------------------------------------------------------ the run

    def _env_failures(self) -> str:
        """The step's environment counters that are not zero (worker restarts, failures by kind)."""
        shown = {k.removeprefix("rollout/env_"): v for k, v in self.env_metrics.items() if v}
        games = getattr(self.envs, "failed_games", {})
        named = [f"{game} x{n}" for game, n in sorted(games.items())][:8]
        return (", ".join(f"{k} {v:g}" for k, v in shown.items()) or "no environment failure counted") + (
            f"; failed episodes per game: {', '.join(named)}" if named else "")

    def control_run(self) -> list[dict[str, Any]]:
        """The no-learning control: the rollouts of every update (same games, same sampling seeds as a real
        run), with the start policy and no update. Which games an update draws moves success by itself."""
        history = []
        for step in range(self.cfg.trainer.steps):
            seed_everything(step_seed(self.cfg.run.seed, step))
            result = self.rollout(step, PhaseTimer())
            stats = result.stats.as_dict()
            history.append({"step": step, "train/success_rate": stats["success_rate"],
                            "train/groups_with_signal": groups_with_signal(result.trajectories),
                            "rollout/invalid_rate": stats["invalid_rate"]})
        return history

    def run(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        ckpt_dir = self.paths.ckpt
        start = 0
        # a damaged newest checkpoint is passed over, changed keys are named (runtime/resume.py)
        resumed = resume_run(cfg, ckpt_dir, self.trained, self.optimizer, self.scheduler)
        if resumed is not None:
            if self.masters is not None:
                self.masters.publish()
            start = resumed.step
            self.bad_steps = resumed.state.get("bad_steps", 0)
        if self.is_main:  # rank 0 alone writes metrics and TensorBoard
            truncate_metrics(self.paths.metrics, start - 1)
            truncate_metrics(self.paths.skills, start - 1)
            self.log = MetricsLogger(self.run_dir, tensorboard=cfg.log.tensorboard,
                                     wandb_project=cfg.log.wandb_project)
        else:
            self.log = NullLogger()
        if resumed is not None and resumed.changes:  # the metrics record what the resumed run changed
            self.log.event({"event": "resume", "checkpoint": str(resumed.path), "first_step": start,
                            "changed": {k: list(v) for k, v in resumed.changes.items()}})
        window = ProfileWindow(cfg.trainer.profile_range())
        history = []
        bar = ProgressBar(cfg.trainer.steps, cfg.algorithm, start) if shows_progress(cfg, self.is_main) else None
        if bar is not None and resumed is not None:
            bar.phase(f"resumed from {resumed.path} at step {start}")
        try:
            self._start_producer(start, resumed)
            for step in range(start, cfg.trainer.steps):
                self.step = step
                window.before_step(step)
                t0 = time.perf_counter()
                metrics = self.rl_step(step)
                metrics["time/step"] = time.perf_counter() - t0
                last = step + 1 == cfg.trainer.steps
                if (cfg.trainer.eval_every and (step + 1) % cfg.trainer.eval_every == 0) or last:
                    metrics.update(self._evaluate())
                window.after_step(step)
                self.log.log(step, metrics)
                history.append({"step": step, **metrics})
                if bar is not None:
                    bar.advance(f"{cfg.algorithm} success {metrics.get('train/success_rate', float('nan')):.2f}",
                                step_fields(metrics))
                    if "eval/success_rate" in metrics:
                        bar.phase(f"evaluation after step {step + 1}: success {metrics['eval/success_rate']:.3f}")
                if (cfg.trainer.checkpoint_every and (step + 1) % cfg.trainer.checkpoint_every == 0) or last:
                    t0 = time.perf_counter()
                    staleness, extra = self._staleness_state(step + 1)
                    saved = save_checkpoint(ckpt_dir, step + 1, self.trained, self.optimizer, self.scheduler,
                                            {"bad_steps": self.bad_steps, **staleness},
                                            keep=cfg.trainer.keep_checkpoints, config_yaml=cfg.to_yaml(),
                                            extra_files=extra)
                    if bar is not None:
                        bar.phase(f"checkpoint {saved} written ({time.perf_counter() - t0:.1f} s)")
            if self.dp is not None:
                # every rank gathers, rank 0 writes, in the compute dtype (the master weights are in the checkpoint;
                # LoRA: merged), and the whole adapters alone for peft beside it
                export_hf(self.policy, self.paths.hf, dtype=DTYPES[cfg.model.dtype])
                if has_lora(self.policy):
                    export_peft_adapter(self.policy, self.paths.adapter, base_model=str(self.start_dir))
            else:
                save_hf(self.policy, self.paths.hf)  # the module that computes: model.dtype (LoRA: merged)
                if has_lora(self.policy):  # beside the merged folder, the adapters alone for peft
                    save_peft_adapter(self.policy, self.paths.adapter, base_model=str(self.start_dir))
            if self.is_main:
                self.tokenizer.save_pretrained(str(self.paths.hf))
        except RolloutProducerError as err:  # one line: what failed, and where a --resume auto starts
            raise err.resumable(resume_point(self.paths.ckpt)) from err.__cause__
        finally:
            if self.producer is not None:
                self.producer.close()
                self.producer = None
            if self.threads_before is not None:
                torch.set_num_threads(self.threads_before)
            if bar is not None:
                bar.close()
            self.log.close()
        return history

    def _start_producer(self, start: int, resumed: Any) -> None:
        """Asynchronous RL: the rollouts a resumed checkpoint kept ahead, then the producer for the rest, sent the
        policy it starts from (version `start`)."""
        steps = self.cfg.trainer.steps
        if self.max_staleness == 0 or start >= steps:
            return
        # rank 0 alone reads the rollouts kept ahead (it feeds every rank); the others learn how many there are
        if self.is_main and resumed is not None:
            self.ahead = restore_ahead(resumed.path, resumed.state, self.max_staleness, start)
        kept = sorted(self.ahead)
        if self.dp is not None:
            box: list[Any] = [kept]
            torch.distributed.broadcast_object_list(box, src=0)
            kept = box[0]
        first_step = start + len(kept)
        self.versions_to_send = set(versions_needed(first_step, start, self.max_staleness, steps))
        if first_step >= steps:
            return
        self.producer_runs = True
        # the producer shares the cores of global rank 0's node with that node's ranks, each of which gives it an
        # equal part of its threads: no core oversubscribed (repeatable runs), no rank slower than the others
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        beside = ranks_beside_producer(dict(os.environ), world)
        producer_threads = None
        if beside:
            self.threads_before = torch.get_num_threads()
            trainer_threads, producer_threads = split_threads(self.threads_before, beside)
            torch.set_num_threads(trainer_threads)
        if not self.is_main:
            if start in self.versions_to_send:
                self._push(start)
            return
        self.producer = RolloutProducer(self.cfg, self.start_dir, first_step=first_step, first_version=start,
                                        device=self.device, threads=producer_threads)
        self.log.event({"event": "rollout_producer", "pid": self.producer.process.pid, "first_step": first_step,
                        "first_version": start, "rollouts_kept": kept})
        if start in self.versions_to_send:
            try:
                self._push(start)
            except BaseException:
                self.producer.close()
                self.producer = None
                raise

    def _producer(self) -> RolloutProducer:
        if self.producer is None:
            raise RuntimeError("no rollout producer runs: every remaining update's rollout was kept ahead")
        return self.producer

    def _staleness_state(self, next_step: int) -> tuple[dict[str, Any], dict[str, bytes]]:
        """The checkpoint's policy version and bound, and with a producer the rollouts of the next max_staleness
        updates, read from it now (they need no weights newer than this checkpoint's), so that a resume repeats the
        run's versions (train/staleness.py). Under torchrun rank 0, which owns the producer, writes them, and the
        other ranks wait for its reads in heartbeats (async_ranks.wait_together), not in the checkpoint's first
        collective, which a long rollout would hold past the process group's timeout."""
        if self.producer_runs:
            for s in range(next_step, min(next_step + self.max_staleness, self.cfg.trainer.steps)):
                wait_together(functools.partial(self._keep_ahead, s) if self.is_main else None, self.dp)
        return ahead_state(next_step, self.max_staleness, self.ahead)

    def _keep_ahead(self, step: int, wait_s: float | None, since: float) -> bool | None:
        """Update `step`'s rollout read from the producer into `ahead` (True), or None when it has not come within
        `wait_s` (wait_together's fetch)."""
        if step not in self.ahead:
            produced = self._producer().next(step, wait_s=wait_s, since=since)
            if produced is None:
                return None
            self.ahead[step] = produced
        return True

    def _evaluate(self) -> dict[str, float]:
        """Held-out metrics, played in the run's environment slots, and what the environments went through: the
        evaluation `seedfast eval` runs (train/evaluate.py evaluate_policy), so both give one policy one result."""
        with unsharded(self.policy):  # sharded: each data-parallel rank plays its chunks of games
            return evaluate_policy(self.cfg, self.policy, self.tokenizer, "eval", envs=self.envs, dp=self.dp)

    def close(self) -> None:
        producer = getattr(self, "producer", None)
        if producer is not None:
            producer.close()
            self.producer = None
        engine = getattr(self, "engine", None)
        if engine is not None:  # the rollout engine first: a vLLM engine's workers end before the process group
            engine.close()
        close = getattr(self.envs, "close", None)
        if close and self.own_envs:
            close()
