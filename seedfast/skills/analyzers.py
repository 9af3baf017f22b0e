"""Analyzers turn finished trajectories into hindsight skills, one SkillResult per trajectory.

- `SelfAnalyzer`: the policy (greedy) through a generation engine (SEED stage 2).
- `ExternalAnalyzer`: an OpenAI-compatible endpoint (SEED stage 1 labels).
- `OracleAnalyzer`: deterministic skills from the trajectory and its walkthrough (tests, CPU demo).
All three answer through the same JSON and the same validator.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from seedfast.envs.base import normalize_action
from seedfast.envs.trajectory import Trajectory
from seedfast.skills.chat_client import ChatClient, ChatError
from seedfast.skills.parse import parse_skill_response
from seedfast.skills.policy_text import GenerationEngine, chat_prompt_ids, generate_texts
from seedfast.skills.prompts import build_analyzer_messages
from seedfast.skills.result import MAX_STEP_SKILLS, SkillResult, check_skill_mode, invalid

ANALYZER_KINDS = ("self", "external", "oracle")
# Prompt shapes tried in turn until the prompt fits the token budget: (max_steps, max_observation_chars).
_PROMPT_SHAPES = ((30, 400), (16, 200), (8, 120), (4, 60))


class Analyzer(Protocol):
    def analyze(self, trajectories: Sequence[Trajectory]) -> list[SkillResult]: ...


def _check_trajectories(trajectories: Sequence[Trajectory]) -> None:
    for index, trajectory in enumerate(trajectories):
        if not isinstance(trajectory, Trajectory):
            raise TypeError(f"trajectories[{index}] must be a Trajectory, got {type(trajectory).__name__}")


def _parse(raw: str, trajectory: Trajectory, skill_mode: str) -> SkillResult:
    return parse_skill_response(raw, task=trajectory.task, n_steps=len(trajectory.steps), skill_mode=skill_mode)


class SelfAnalyzer:
    """The policy analyzes its own trajectories through `engine.generate` (greedy unless `temperature` > 0)."""

    def __init__(self, engine: GenerationEngine, tokenizer: Any, skill_mode: str = "episode_only",
                 max_new_tokens: int = 256, max_prompt_tokens: int = 2048, stop_ids: Sequence[int] | None = None,
                 temperature: float = 0.0):
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {temperature!r}")
        if not hasattr(engine, "generate"):
            raise TypeError(f"engine must have a generate() method, got {type(engine).__name__}")
        if not hasattr(tokenizer, "apply_chat_template"):
            raise TypeError(f"tokenizer must have apply_chat_template(), got {type(tokenizer).__name__}")
        self.engine, self.tokenizer = engine, tokenizer
        self.skill_mode = check_skill_mode(skill_mode)
        self.max_new_tokens, self.max_prompt_tokens = max_new_tokens, max_prompt_tokens
        self.stop_ids = list(stop_ids) if stop_ids is not None else None
        self.temperature = temperature

    def prompt_ids(self, trajectory: Trajectory) -> list[int] | None:
        """The prompt's token ids, shortened until it fits `max_prompt_tokens`; None if it never does."""
        for max_steps, max_chars in _PROMPT_SHAPES:
            messages = build_analyzer_messages(trajectory, self.skill_mode, max_chars, max_steps)
            ids = chat_prompt_ids(self.tokenizer, messages)
            if len(ids) <= self.max_prompt_tokens:
                return ids
        return None

    def analyze(self, trajectories: Sequence[Trajectory]) -> list[SkillResult]:
        _check_trajectories(trajectories)
        # a group's identical trajectories ask the same question: each distinct prompt is tokenized once (and the
        # engine generates a repeated greedy prompt once: rollout/own_engine.py)
        built: dict[str, list[int] | None] = {}
        prompts = []
        max_steps, max_chars = _PROMPT_SHAPES[0]
        for t in trajectories:
            key = repr(build_analyzer_messages(t, self.skill_mode, max_chars, max_steps))
            if key not in built:
                built[key] = self.prompt_ids(t)
            prompts.append(built[key])
        fitting = [i for i, p in enumerate(prompts) if p is not None]
        texts = generate_texts(self.engine, self.tokenizer, [prompts[i] for i in fitting], self.max_new_tokens,
                               temperature=self.temperature, top_p=1.0, stop_ids=self.stop_ids)
        results = [invalid("prompt_too_long") for _ in trajectories]
        for i, text in zip(fitting, texts):
            results[i] = _parse(text, trajectories[i], self.skill_mode)
        return results


class ExternalAnalyzer:
    """An OpenAI-compatible model analyzes the trajectories, `client.max_concurrency` at a time."""

    def __init__(self, client: ChatClient, skill_mode: str = "episode_only", max_observation_chars: int = 400,
                 max_steps: int = 30):
        if not isinstance(client, ChatClient):
            raise TypeError(f"client must be a ChatClient, got {type(client).__name__}")
        self.client = client
        self.skill_mode = check_skill_mode(skill_mode)
        self.max_observation_chars, self.max_steps = max_observation_chars, max_steps

    def analyze(self, trajectories: Sequence[Trajectory]) -> list[SkillResult]:
        _check_trajectories(trajectories)
        conversations = [build_analyzer_messages(t, self.skill_mode, self.max_observation_chars, self.max_steps)
                         for t in trajectories]
        results = []
        for trajectory, answer in zip(trajectories, self.client.complete_many(conversations)):
            if isinstance(answer, ChatError):
                results.append(invalid("request_failed", str(answer)))
            else:
                results.append(_parse(answer, trajectory, self.skill_mode))
        return results


class OracleAnalyzer:
    """Skills computed from the walkthrough: a success gives its action order as a workflow; a failure
    gives its first deviation from the walkthrough as the core mistake, and the walkthrough as the fix.

    TextWorld games can have several solutions; a failure that left the walkthrough on a path that could
    still have won is nonetheless blamed on the deviation (good enough for tests and the CPU demo).
    """

    def __init__(self, skill_mode: str = "episode_only"):
        self.skill_mode = check_skill_mode(skill_mode)

    def analyze(self, trajectories: Sequence[Trajectory]) -> list[SkillResult]:
        _check_trajectories(trajectories)
        results = []
        for trajectory in trajectories:
            if not trajectory.walkthrough:
                results.append(invalid("no_walkthrough"))
                continue
            answer = oracle_answer(trajectory, with_step_skills=self.skill_mode != "episode_only")
            results.append(_parse(json.dumps(answer), trajectory, self.skill_mode))
        return results


def on_walkthrough_path(actions: Sequence[str], walkthrough: Sequence[str]) -> list[bool]:
    """Per step, whether it advanced the walkthrough: its action is the walkthrough's next action not yet taken
    (a detour, such as 'look' or an admissible move the walkthrough does not make, is not on the path)."""
    done, path = 0, []
    for action in actions:
        hit = done < len(walkthrough) and normalize_action(action) == normalize_action(walkthrough[done])
        path.append(hit)
        done += hit
    return path


def oracle_answer(trajectory: Trajectory, with_step_skills: bool = False) -> dict[str, Any]:
    """The analyzer JSON the oracle gives for one trajectory (needs `trajectory.walkthrough`).

    A winner's workflow and step skills name only the steps on the walkthrough's path, so a detour is never
    endorsed. A loser's skill is the same workflow and its step skills are the walkthrough's actions up to and
    including its first deviation: its right steps are credited, its wrong command is never quoted, since the
    reader copies quoted commands (docs/demo.md, 'Oracle skills that say what is right')."""
    plan = list(trajectory.walkthrough or [])
    if not plan:
        raise ValueError(f"trajectory {trajectory.game_id!r} has no walkthrough")
    plan_text = " -> ".join(plan)
    taken = [step.action for step in trajectory.steps]
    step_skills: dict[str, str] = {}
    if trajectory.won:
        path = on_walkthrough_path(taken, plan)
        # a win by another route than the walkthrough's: its valid actions were a solution all the same
        route = ([a for a, on in zip(taken, path) if on] if sum(path) == len(plan)
                 else [step.action for step in trajectory.steps if step.valid])
        summary = f"The agent solved the task in {len(taken)} steps."
        skill = (f"Workflow: carry out the objective's instructions in the order they are given, one admissible "
                 f"command each: {' -> '.join(route)}. Decision rule: act on the objective only; looking "
                 f"around or trying other rooms wastes steps.")
        for index, (step, on) in enumerate(zip(trajectory.steps, path)):
            if on and len(step_skills) < MAX_STEP_SKILLS:
                step_skills[str(index)] = f"Do '{step.action}' now."
    else:
        deviation = next((i for i, (a, b) in enumerate(zip(taken, plan))
                          if normalize_action(a) != normalize_action(b)), None)
        # the loser's right steps (before its first deviation) are credited like a winner's, and its wrong command
        # is never quoted: the reader copies quoted commands (docs/demo.md, 'Oracle skills that say what is right')
        workflow = (f"Workflow: carry out the objective's instructions in the order they are given, one admissible "
                    f"command each: {plan_text}.")
        if deviation is not None:
            right = plan[deviation]
            why = ("its command was not admissible" if not trajectory.steps[deviation].valid
                   else "its command was not in the objective")
            summary = f"The agent failed: at step {deviation} the right action was '{right}'; {why}."
            skill = f"{workflow} At step {deviation} do '{right}': the agent left the walkthrough there."
            right_steps = deviation + 1
        else:
            stop = len(taken)
            nxt = plan[stop] if stop < len(plan) else plan[-1]
            summary = f"The agent failed: it stopped after {stop} correct steps, before '{nxt}'."
            skill = f"{workflow} After {stop} correct steps do '{nxt}': the agent never did it."
            right_steps = min(stop, len(plan))
        for index in range(min(right_steps, MAX_STEP_SKILLS)):
            step_skills[str(index)] = f"Do '{plan[index]}' now."
    answer: dict[str, Any] = {"episode_summary": summary, "episode_skill": skill}
    if with_step_skills and step_skills:
        answer["step_skills"] = step_skills
    return answer


def make_analyzer(kind: str, **options: Any) -> Analyzer:
    """`self` (engine=, tokenizer=), `external` (client= or base_url=, model=, ...), or `oracle`."""
    if kind == "self":
        return SelfAnalyzer(**options)
    if kind == "external":
        client = options.pop("client", None)
        analyzer_keys = {"skill_mode", "max_observation_chars", "max_steps"}
        analyzer_options = {k: options.pop(k) for k in list(options) if k in analyzer_keys}
        return ExternalAnalyzer(client or ChatClient(**options), **analyzer_options)
    if kind == "oracle":
        return OracleAnalyzer(**options)
    raise ValueError(f"analyzer kind {kind!r} is not one of {ANALYZER_KINDS}")
