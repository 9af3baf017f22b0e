"""The privileged text of each algorithm, per trajectory, and its failures counted (docs/algorithms.md: 'SEED',
'SDAR', 'GRSD').

- seed: π_old analyzes each trajectory into a hindsight skill (episode skill, optional step skills).
- sdar: a static provider (skill library per task type).
- grsd: reflections (sampled) → judge scores → for groups with a success and a failure, guidance written by
  the policy (greedy) from the success and failure reflections; the guidance is that group's privileged text.
- grpo: none.
A trajectory whose text failed (parse error, analyzer error) gets None: it leaves OPD, never RL (docs/algorithms.md,
'OPD gate'). Every writer takes `(ctx, trajectories)`: a `WriterContext` holds what any of them may read.

skill.shuffle=derange (SEED's writer, the shuffled-skill control of docs/study.md): after the analyzer has written
every trajectory's skills, trajectory j of the update's i-th game reads those of trajectory j of game π(i), π a
derangement of the update's games drawn from seeds.skill_shuffle_seed(run.seed, update) (`shuffle_skills`).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from seedfast.algo import grsd as grsd_math
from seedfast.config import Config
from seedfast.envs.trajectory import Trajectory
from seedfast.sampling_params import SamplingParams
from seedfast.seeds import skill_shuffle_seed
from seedfast.skills import reflection as grsd_text
from seedfast.skills.analyzers import make_analyzer
from seedfast.skills.chat_client import ChatClient
from seedfast.skills.library import SkillLibrary
from seedfast.skills.policy_text import chat_prompt_ids, generate_texts
from seedfast.skills.result import teacher_texts


@dataclass
class Reflections:
    """GRSD stage A: one reflection per trajectory, its prompt/response ids (for its own RL loss) and score."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    texts: list[str]
    valid: list[bool]  # the reflection parses as numbered key points (guidance reads only those)
    scores: list[float]  # the judge's; 0 for an empty reflection; NaN where the judge gave no score


@dataclass(frozen=True)
class WriterContext:
    """What a writer may read, each taking its part: the run's config; the policy's engine and tokenizer (the `self`
    analyzer, GRSD's reflections and guidance); each trajectory's group (GRSD's contrast groups); the judge and the
    analyzer the run built once (None: the writer builds them from the config); the update's index."""

    cfg: Config
    engine: Any
    tokenizer: Any
    group_of: Sequence[int] = ()
    judge: Any = None
    analyzer: Any = None
    step: int = 0  # the RL update the trajectories belong to (skill.shuffle's derangement is drawn per update)


@dataclass
class Privileged:
    episode: list[str | None]  # per trajectory
    step: list[dict[int, str]] = field(default_factory=list)  # per trajectory: step index -> step skill
    metrics: dict[str, float] = field(default_factory=dict)
    reflections: Reflections | None = None


def _external_client(cfg: Config, **overrides: Any) -> ChatClient:
    """The skill.external endpoint's client; the analyzer caps its answer at skill.max_analysis_tokens
    (skill_analyzer), the GRSD judge keeps the client's default."""
    ext = cfg.skill.external
    return ChatClient(base_url=ext.endpoint, model=ext.model, api_key_env=ext.api_key_env, timeout_s=ext.timeout_s,
                      max_retries=ext.retries, max_concurrency=ext.concurrency, temperature=ext.temperature,
                      **overrides)


def skill_analyzer(cfg: Config, kind: str, engine: Any, tokenizer: Any) -> Any:
    """The analyzer of `kind` (skill.analyzer in RL, skill.collect_analyzer in `seedfast collect`) with the skill.*
    options: one mapping for every command. `self` writes through `engine` (the policy)."""
    if kind == "self":
        return make_analyzer("self", engine=engine, tokenizer=tokenizer, skill_mode=cfg.skill.skill_mode,
                             max_new_tokens=cfg.skill.max_analysis_tokens,
                             max_prompt_tokens=cfg.rollout.max_prompt_length,
                             temperature=cfg.skill.analysis_temperature)
    if kind == "external":
        return make_analyzer("external", client=_external_client(cfg, max_tokens=cfg.skill.max_analysis_tokens),
                             skill_mode=cfg.skill.skill_mode)
    return make_analyzer(kind, skill_mode=cfg.skill.skill_mode)


def run_analyzer(cfg: Config, engine: Any, tokenizer: Any) -> Any:
    """The RL run's analyzer (skill.analyzer), built once per run by the trainer."""
    return skill_analyzer(cfg, cfg.skill.analyzer, engine, tokenizer)


def sdar_analyzer(cfg: Config, engine: Any, tokenizer: Any) -> Any:
    """SDAR's analyzer: none when its skills come from skill.library."""
    return None if cfg.skill.library else run_analyzer(cfg, engine, tokenizer)


def seed_skills(ctx: WriterContext, trajectories: Sequence[Trajectory]) -> Privileged:
    """SEED's writer: the hindsight skills of `ctx.analyzer` (default: the configured one, built here)."""
    cfg = ctx.cfg
    analyzer = ctx.analyzer or run_analyzer(cfg, ctx.engine, ctx.tokenizer)
    try:
        results = analyzer.analyze(list(trajectories))
        reasons = Counter(r.reason for r in results)
    except Exception as err:  # a failing analyzer masks OPD for the batch; the run goes on
        results, reasons = [], Counter({f"analyzer_error:{type(err).__name__}": len(trajectories)})
    episode: list[str | None] = [None] * len(trajectories)
    step: list[dict[int, str]] = [{} for _ in trajectories]
    for i, r in enumerate(results):
        episode[i], step[i] = teacher_texts(r, cfg.skill.skill_mode)  # what SFT's bc_skill copies read too
    n = max(len(trajectories), 1)
    metrics = {"skill/parse_rate": sum(e is not None or bool(s) for e, s in zip(episode, step)) / n}
    for reason, count in reasons.items():
        if reason != "ok":
            metrics[f"skill/fail_{reason}"] = count / n
    if cfg.skill.shuffle == "derange":
        episode, step, shuffled = shuffle_skills(trajectories, episode, step, cfg.run.seed, ctx.step)
        metrics.update(shuffled)
    return Privileged(episode, step, metrics)


def derangement(rng: np.random.Generator, n: int) -> list[int]:
    """A uniform derangement of range(n) (π(i) != i for every i): permutations drawn from `rng` until one is
    (docs/study.md, 'The shuffled-skill control'); about e ≈ 2.7 draws on average. n < 2 has none."""
    if n < 2:
        raise ValueError(f"no derangement of {n} item(s): it needs at least 2")
    while True:
        perm = rng.permutation(n)
        if not (perm == np.arange(n)).any():
            return [int(i) for i in perm]


def game_groups(trajectories: Sequence[Trajectory]) -> list[list[int]]:
    """The update's games in draw order (the order the rollout played them: group_id, else game id, by first
    appearance), each the indices of its trajectories in order (trajectory j of the game is its j-th)."""
    groups: dict[Any, list[int]] = {}
    for i, t in enumerate(trajectories):
        groups.setdefault(t.meta.get("group_id", t.game_id), []).append(i)
    return list(groups.values())


def shuffle_sources(trajectories: Sequence[Trajectory], run_seed: int, step: int
                    ) -> tuple[list[int], list[int] | None]:
    """Per trajectory, the index of the trajectory whose skills it reads under skill.shuffle=derange, and π (None
    when the update has fewer than two games: then every trajectory keeps its own). Trajectory j of game i reads
    trajectory j of game π(i) (j modulo that game's count, should the games have played different counts)."""
    groups = game_groups(trajectories)
    source = list(range(len(trajectories)))
    if len(groups) < 2:
        return source, None
    perm = derangement(np.random.default_rng(skill_shuffle_seed(run_seed, step)), len(groups))
    for i, members in enumerate(groups):
        donor = groups[perm[i]]
        for j, t in enumerate(members):
            source[t] = donor[j % len(donor)]
    return source, perm


def shuffle_skills(trajectories: Sequence[Trajectory], episode: list[str | None], step: list[dict[int, str]],
                   run_seed: int, update: int) -> tuple[list[str | None], list[dict[int, str]], dict[str, float]]:
    """The skills as skill.shuffle=derange hands them out (`shuffle_sources`): episode skills and step skills as
    written, step skills keeping their step indices. Metrics: skill/shuffled, the share of trajectories reading
    another trajectory's skill (another game's: the update's games are distinct); skill/shuffle_games, the games
    deranged (0 when left unshuffled); skill/shuffle_unshuffled, the share left with their own skill because the
    update had one game (counted and warned, never silent); skill/shuffle_mask_moved, the share whose teacher-valid
    status changed (0 whenever every skill parses, as the oracle's do)."""
    source, perm = shuffle_sources(trajectories, run_seed, update)
    n = max(len(trajectories), 1)
    if perm is None and trajectories:
        warnings.warn(f"skill.shuffle=derange: update {update} has one game, so its {len(trajectories)} trajectories "
                      "keep their own skills (skill/shuffle_unshuffled)", stacklevel=2)
    has = [e is not None or bool(s) for e, s in zip(episode, step)]
    new_episode = [episode[k] for k in source]
    new_step = [dict(step[k]) for k in source] if step else step
    metrics = {
        "skill/shuffled": sum(k != i for i, k in enumerate(source)) / n,
        "skill/shuffle_games": float(0 if perm is None else len(perm)),
        "skill/shuffle_unshuffled": (len(trajectories) if perm is None else 0) / n,
        "skill/shuffle_mask_moved": sum(has[i] != has[k] for i, k in enumerate(source)) / n,
    }
    return new_episode, new_step, metrics


def sdar_skills(ctx: WriterContext, trajectories: Sequence[Trajectory]) -> Privileged:
    """SDAR's writer, a static provider: the library file, else per-task oracle/external skills."""
    if not ctx.cfg.skill.library:
        return seed_skills(ctx, trajectories)
    library = SkillLibrary.from_file(ctx.cfg.skill.library)
    episode: list[str | None] = []
    failures = 0
    for t in trajectories:
        try:
            episode.append(library.for_trajectory(t))
        except (KeyError, ValueError):
            episode.append(None)
            failures += 1
    return Privileged(episode, [{} for _ in trajectories],
                      {"skill/parse_rate": 1 - failures / max(len(trajectories), 1)})


def grsd_guidance(ctx: WriterContext, trajectories: Sequence[Trajectory]) -> Privileged:
    """GRSD's writer: reflections, judged, then each contrast group's guidance."""
    cfg, engine, tokenizer, group_of = ctx.cfg, ctx.engine, ctx.tokenizer, ctx.group_of
    judge = ctx.judge or make_judge(cfg)
    # stage A: reflections, sampled from the policy
    prompts = [chat_prompt_ids(tokenizer, grsd_text.build_reflection_messages(t)) for t in trajectories]
    params = SamplingParams(cfg.grsd.max_reflection_tokens, cfg.rollout.temperature, cfg.rollout.top_p,
                            _stop_ids(tokenizer))
    gens = engine.generate_full(prompts, params)
    texts = tokenizer.batch_decode([g.token_ids for g in gens], skip_special_tokens=True)
    parsed = [grsd_text.parse_reflection(t) for t in texts]
    valid = [p.valid for p in parsed]
    scores = judge_reflections(judge, trajectories, texts)
    reflections = Reflections(prompts, [list(g.token_ids) for g in gens], texts, valid, scores)
    # stage B: guidance for groups with a success and a failure (greedy policy snapshot)
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_of):
        groups.setdefault(g, []).append(i)
    with_contrast = grsd_math.contrast_groups([t.won for t in trajectories], group_of)
    contrast = {g: idx for g, idx in groups.items() if g in with_contrast}
    episode: list[str | None] = [None] * len(trajectories)
    asks, owners = [], []
    for g, idx in contrast.items():
        succ = [parsed[i].text for i in idx if trajectories[i].won and parsed[i].valid]
        fail = [parsed[i].text for i in idx if not trajectories[i].won and parsed[i].valid]
        if succ and fail:
            msgs = grsd_text.build_guidance_messages(trajectories[idx[0]].task, succ, fail)
            asks.append(chat_prompt_ids(tokenizer, msgs))
            owners.append(g)
    answers = generate_texts(engine, tokenizer, asks, cfg.grsd.max_guidance_tokens, temperature=0.0, top_p=1.0,
                             stop_ids=_stop_ids(tokenizer)) if asks else []
    n_valid = 0
    for g, answer in zip(owners, answers):
        guidance = grsd_text.validate_guidance(answer)
        if guidance.valid:
            n_valid += 1
            for i in groups[g]:
                episode[i] = guidance.text
    n = max(len(trajectories), 1)
    metrics = {
        "grsd/reflection_valid_rate": sum(valid) / n,
        "grsd/reflection_empty_rate": sum(not t.strip() for t in texts) / n,
        "grsd/judged_rate": sum(s == s for s in scores) / n,
        "grsd/contrast_groups": float(len(contrast)),
        "grsd/guidance_valid": float(n_valid),
        "skill/parse_rate": n_valid / max(len(contrast), 1),
    }
    return Privileged(episode, [{} for _ in trajectories], metrics, reflections)


def judge_reflections(judge: Any, trajectories: Sequence[Trajectory], texts: Sequence[str]) -> list[float]:
    """One score per reflection, as the GRSD reference does (docs/algorithms.md, 'GRSD'): the judge grades every
    non-empty reflection as written, whatever its form; an empty one scores 0 without asking, and stays in its
    group's normalization. NaN only where the judge gave no score (a failed request: no signal, not a 0)."""
    written = [t.strip() for t in texts]
    asked = [i for i, w in enumerate(written) if w]
    try:
        judged = judge.score([trajectories[i] for i in asked], [written[i] for i in asked]) if asked else []
    except Exception:  # a failing judge gives no reflection signal this step; counted in grsd/judged_rate
        judged = [None] * len(asked)
    scores = [0.0] * len(texts)
    for i, score in zip(asked, judged):
        scores[i] = float("nan") if score is None else float(score)
    return scores


def _stop_ids(tokenizer: Any) -> list[int]:
    from seedfast.rollout.agent_loop import stop_token_ids

    return stop_token_ids(tokenizer)


def make_judge(cfg: Config) -> Any:
    if cfg.grsd.judge == "external":
        return grsd_text.ExternalJudge(_external_client(cfg))
    return grsd_text.OracleJudge()
