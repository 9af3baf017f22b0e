"""Multi-turn agent loop: N trajectories per task, all live episodes stepped in lockstep.

Each step builds one prompt per live episode, makes ONE batched `generate` call, parses the actions and
steps every environment through the slot interface (a worker pool or in-process envs). Responses are kept
as the generated ids (docs/pitfalls.md, 'Re-tokenization drift in multi-turn loops'); the decoded text is used
only to parse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from seedfast.envs.base import Observation
from seedfast.envs.slots import EnvSlots
from seedfast.envs.trajectory import Trajectory, TrajectoryStep, record_score
from seedfast.rollout.actions import parse_action
from seedfast.rollout.engine import Generation
from seedfast.rollout.prompts import UNPARSABLE_FEEDBACK, Prompt, PromptStyle, Turn, build_prompt
from seedfast.rollout.records import RolloutResult, RolloutStats, StepRecord
from seedfast.sampling_params import SamplingParams


@dataclass(frozen=True)
class Task:
    """One game: `spec` is what the environment factory opens (a game path), the rest travels along."""

    game_id: str
    spec: Any
    walkthrough: list[str] | None = None

    @classmethod
    def from_record(cls, record: Any) -> Task:
        """From a seedfast.envs.textworld_games.GameRecord (id, path, walkthrough)."""
        return cls(record.id, record.path, list(record.walkthrough) if record.walkthrough is not None else None)


@dataclass(frozen=True)
class AgentLoopConfig:
    n: int = 8  # trajectories per task (the GRPO group)
    max_steps: int = 10
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    invalid_penalty: float = 0.1
    max_prompt_tokens: int | None = None
    style: PromptStyle = field(default_factory=PromptStyle)
    world: str = "textworld"  # env.kind, stamped on every trajectory (meta["world"]): the analyzer's prompt follows it

    def __post_init__(self) -> None:
        for name in ("n", "max_steps", "max_new_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.invalid_penalty < 0:
            raise ValueError(f"invalid_penalty must be >= 0, got {self.invalid_penalty!r}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be None or >= 1, got {self.max_prompt_tokens!r}")


@dataclass
class _Episode:
    slot: int
    index: int  # trajectory index
    task_index: int
    trajectory: Trajectory
    observation: Observation
    history: list[Turn] = field(default_factory=list)
    pending: list[dict[str, Any]] = field(default_factory=list)  # per step: the StepRecord fields
    done: bool = False


def stop_token_ids(tokenizer) -> list[int]:
    """End-of-turn and end-of-text ids of a chat tokenizer (those it has)."""
    ids = {tokenizer.eos_token_id}
    for token in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            ids.add(token_id)
    return sorted(i for i in ids if i is not None)


def run_agent_loop(
    engine,
    tokenizer,
    tasks: Sequence[Task],
    envs: EnvSlots,
    config: AgentLoopConfig | None = None,
    stop_ids: Sequence[int] | None = None,
) -> RolloutResult:
    """Roll out `config.n` trajectories on each task; trajectory `t * n + j` is copy j of task t.

    Episodes run in lockstep, `envs.n_slots` at a time (all of them at once when there are enough slots).
    `group_id` of a step is its task index, `trajectory_index` its trajectory's index in the result.
    """
    config = config or AgentLoopConfig()
    if not tasks:
        raise ValueError("tasks is empty: give at least one task to roll out")
    stops = stop_token_ids(tokenizer) if stop_ids is None else stop_ids
    params = SamplingParams(config.max_new_tokens, config.temperature, config.top_p, stops)
    stats = RolloutStats()
    total = len(tasks) * config.n
    episodes: list[_Episode] = []
    for first in range(0, total, envs.n_slots):
        wave = _start(tasks, envs, range(first, min(first + envs.n_slots, total)), config.n, stats)
        _run_wave(engine, tokenizer, envs, wave, config, params, stats)
        episodes += wave
    return _finish(episodes, config, stats)


def _run_wave(engine, tokenizer, envs: EnvSlots, episodes: list[_Episode], config: AgentLoopConfig,
              params: SamplingParams, stats: RolloutStats) -> None:
    for step_index in range(config.max_steps):
        live = [e for e in episodes if not e.done]
        if not live:
            break
        prompts = [_prompt(tokenizer, e, step_index, config, stats) for e in live]
        generations = engine.generate_full([p.ids for p in prompts], params)
        stats.generate_calls += 1
        if len(generations) != len(prompts):
            raise RuntimeError(f"the engine returned {len(generations)} completions for {len(prompts)} prompts")
        texts = tokenizer.batch_decode([g.token_ids for g in generations], skip_special_tokens=True)
        actions = [parse_action(text) for text in texts]
        outcomes = envs.step({e.slot: a for e, a in zip(live, actions) if a is not None})
        for episode, prompt, generation, text, action in zip(live, prompts, generations, texts, actions):
            outcome = outcomes[episode.slot] if action is not None else None
            _advance(episode, prompt, generation, text, action, outcome, step_index, stats)
    for episode in episodes:
        if not episode.done:
            stats.truncated += 1
            episode.trajectory.meta["truncated"] = True


def _start(tasks: Sequence[Task], envs: EnvSlots, indices: range, n: int, stats: RolloutStats) -> list[_Episode]:
    slot_of = {index: index - indices.start for index in indices}
    first = envs.reset({slot_of[i]: tasks[i // n].spec for i in indices})
    episodes = []
    for index in indices:
        task, obs = tasks[index // n], first[slot_of[index]]
        trajectory = Trajectory(task="", game_id=task.game_id, walkthrough=task.walkthrough)
        trajectory.meta.update({"group_id": index // n, "trajectory_index": index})
        episode = _Episode(slot_of[index], index, index // n, trajectory,
                           obs if isinstance(obs, Observation) else Observation("", ""))
        if isinstance(obs, Observation):
            trajectory.task = obs.task
        else:
            trajectory.error, episode.done = f"reset failed: {obs}", True
            stats.env_errors += 1
        episodes.append(episode)
    return episodes


def _prompt(tokenizer, episode: _Episode, step_index: int, config: AgentLoopConfig, stats: RolloutStats) -> Prompt:
    obs, style = episode.observation, config.style
    prompt = build_prompt(tokenizer, obs.task, episode.history, obs.text, obs.admissible_actions, step_index, style)
    limit = config.max_prompt_tokens
    if limit is None or len(prompt.ids) <= limit:
        return prompt
    stats.prompt_truncations += 1
    for k in range(min(style.history_k, len(episode.history)) - 1, -1, -1):
        shorter = PromptStyle(style.system, style.instructions, k, style.show_admissible)
        prompt = build_prompt(tokenizer, obs.task, episode.history, obs.text, obs.admissible_actions, step_index,
                              shorter)
        if len(prompt.ids) <= limit:
            return prompt
    raise ValueError(
        f"game {episode.trajectory.game_id!r} step {step_index}: the prompt is {len(prompt.ids)} tokens without "
        f"any history, over max_prompt_tokens={limit}"
    )


def _advance(
    episode: _Episode,
    prompt: Prompt,
    generation: Generation,
    text: str,
    action: str | None,
    outcome: tuple[Observation, float, bool, dict] | None,
    step_index: int,
    stats: RolloutStats,
) -> None:
    stats.steps += 1
    stats.generated_tokens += len(generation.token_ids)
    stats.response_truncations += generation.finish_reason == "length"
    obs = episode.observation
    if action is None:
        stats.unparsable += 1
        next_obs = Observation(UNPARSABLE_FEEDBACK, obs.task, obs.admissible_actions)
        valid, done, info = False, False, {}
    else:
        next_obs, _, done, info = outcome
        valid = bool(info.get("valid", True))  # a crashed environment is not the policy's fault
    stats.invalid_actions += not valid
    episode.trajectory.steps.append(
        TrajectoryStep(obs.text, list(obs.admissible_actions), action or "", list(generation.token_ids), valid,
                       0.0, text)
    )
    episode.pending.append(
        dict(segments=prompt.segments, response_ids=tuple(generation.token_ids),
             response_logprobs=None if generation.logprobs is None else tuple(generation.logprobs),
             step_index=step_index, valid=valid, parsed=action is not None, finish_reason=generation.finish_reason)
    )
    record_score(episode.trajectory, info)
    if "error" in info:
        stats.env_errors += 1
        episode.trajectory.error = str(info["error"])
        episode.done = True
        return
    episode.history.append(Turn(obs.text, action if action is not None else "(no action)"))
    episode.observation = next_obs
    if done:
        episode.done = True
        episode.trajectory.won = bool(info.get("won", False))


def _finish(episodes: list[_Episode], config: AgentLoopConfig, stats: RolloutStats) -> RolloutResult:
    trajectories, records = [], []
    for episode in episodes:
        trajectory = episode.trajectory
        outcome = 1.0 if trajectory.won else 0.0
        for step, fields in zip(trajectory.steps, episode.pending):
            penalty = config.invalid_penalty * (not step.valid)
            step.reward = outcome - penalty
            records.append(
                StepRecord(reward=step.reward, penalty=penalty, group_id=episode.task_index,
                           trajectory_index=episode.index, **fields)
            )
        trajectory.meta["outcome"] = outcome
        trajectory.meta["world"] = config.world
        stats.trajectories += 1
        stats.won += trajectory.won
        trajectories.append(trajectory)
    return RolloutResult(trajectories, records, stats)
