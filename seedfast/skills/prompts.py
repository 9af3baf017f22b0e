"""The hindsight-skill analyzer prompt: trajectory -> JSON {"episode_summary", "episode_skill"} (docs/algorithms.md,
'SEED').

The same messages serve the external analyzer (stage 1 labels), the skill-writing SFT and the policy
analyzing its own rollouts (stage 2), so what the policy learns to answer is what it is later asked.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from seedfast.envs.trajectory import Trajectory
from seedfast.skills.render import outcome_line, render_turns
from seedfast.skills.result import MAX_STEP_SKILLS, SkillResult, check_skill_mode

SYSTEM_PROMPT = "You analyze finished episodes of a text-game agent and answer with one JSON object."
SUMMARY_PLACEHOLDER = "<one or two sentences on what happened>"
SKILL_PLACEHOLDER = "<the skill>"
STEP_SKILL_PLACEHOLDER = "<one imperative sentence>"
PLACEHOLDERS = (SUMMARY_PLACEHOLDER, SKILL_PLACEHOLDER, STEP_SKILL_PLACEHOLDER)

_SUCCESS_RULE = ("The episode SUCCEEDED. Write the skill as a workflow for similar tasks: the decision rule "
                 "that made it work and the order of the actions that solved it.")
_FAILURE_RULE = ("The episode FAILED. Write the skill as avoidance rules for similar tasks: the core mistake "
                 "that made it fail and the warning signs that should have revealed it.")
_STEP_SKILL_EXAMPLE = '{"1": "Open the fridge before taking the milk."}'


@dataclass(frozen=True)
class AnalyzerWorld:
    """What the analyzer's prompt says about the world its trajectory was played in; the rest is every world's."""

    system: str = SYSTEM_PROMPT
    about: str = ""  # a paragraph before the trajectory: the world and its actions
    show_score: bool = False  # the score after each step (meta["scores"]), as a line of its changes
    step_skill_example: str = _STEP_SKILL_EXAMPLE


def _scienceworld() -> AnalyzerWorld:
    from seedfast.envs.scienceworld_env import ACTION_TEMPLATES

    return AnalyzerWorld(
        system=("You analyze finished episodes of an agent in ScienceWorld, a text world of elementary science tasks, "
                "and answer with one JSON object."),
        about=("The agent acts with the simulator's action templates, OBJ and LOC named as the observation names "
               f"them: {ACTION_TEMPLATES} The score goes from 0 to 100 as the task's stages are done; 100 completes "
               "the task, and a negative score means the task was made impossible."),
        show_score=True,
        step_skill_example='{"1": "Go to the kitchen before looking for the thermometer."}')


# The one place an analyzer's per-world text is decided, by the world the trajectory was played in (meta["world"]:
# env.kind, stamped by the agent loop and SFT's replays). TextWorld's is the default: a world not named here, or a
# trajectory saved before worlds were stamped, gets it.
ANALYZER_WORLDS: dict[str, Callable[[], AnalyzerWorld]] = {
    "textworld": AnalyzerWorld,
    "alfworld": AnalyzerWorld,
    "scienceworld": _scienceworld,
}


def analyzer_world(trajectory: Trajectory) -> AnalyzerWorld:
    """The per-world text of `trajectory`'s analyzer prompt (ANALYZER_WORLDS)."""
    return ANALYZER_WORLDS.get(str(trajectory.meta.get("world", "textworld")), AnalyzerWorld)()


def score_line(scores: Sequence[int | float | None] | None) -> str:
    """The score after each step (None: not known), as its changes: 'Score (0-100): 0 at the start; 25 after step 2,
    100 after step 5; final score 100.'"""
    known = [(i, s) for i, s in enumerate(scores or ()) if s is not None]
    if not known:
        return "Score (0-100): not recorded."
    changes, last = [], 0
    for index, score in known:
        if score != last:
            changes.append(f"{score:g} after step {index}")
            last = score
    moved = ", ".join(changes) if changes else "it never moved"
    return f"Score (0-100): 0 at the start; {moved}; final score {known[-1][1]:g}."


def build_analyzer_messages(trajectory: Trajectory, skill_mode: str = "episode_only",
                            max_observation_chars: int = 400, max_steps: int = 30) -> list[dict[str, str]]:
    """Chat messages (system + user) asking for the hindsight skill of one trajectory, in its world's words
    (`analyzer_world`)."""
    if not isinstance(trajectory, Trajectory):
        raise TypeError(f"trajectory must be a Trajectory, got {type(trajectory).__name__}")
    check_skill_mode(skill_mode)
    world = analyzer_world(trajectory)
    schema = {"episode_summary": SUMMARY_PLACEHOLDER, "episode_skill": SKILL_PLACEHOLDER}
    parts = [f"Task: {trajectory.task}", f"Outcome: {outcome_line(trajectory)}"]
    if world.show_score:
        parts.append(score_line(trajectory.meta.get("scores")))
    if world.about:
        parts.append(world.about)
    parts += [
        "Trajectory:\n" + render_turns(trajectory, max_observation_chars, max_steps),
        _SUCCESS_RULE if trajectory.won else _FAILURE_RULE,
        "The skill must help on other tasks of this kind: do not just repeat the task.",
        "Answer with one JSON object and nothing else:\n" + json.dumps(schema),
    ]
    if skill_mode != "episode_only":
        need = "must" if skill_mode == "step_only" else "may"
        parts.append(f'You {need} add "step_skills": an object that maps a 0-based step index to '
                     f"{STEP_SKILL_PLACEHOLDER} for at most {MAX_STEP_SKILLS} critical steps, "
                     f"e.g. {world.step_skill_example}.")
    return [{"role": "system", "content": world.system}, {"role": "user", "content": "\n\n".join(parts)}]


def analyzer_sft_messages(trajectory: Trajectory, result: SkillResult, skill_mode: str = "episode_only",
                          **prompt_options: int) -> list[dict[str, str]]:
    """Prompt plus the validated answer, as one conversation for skill-writing SFT."""
    if not result.valid:
        raise ValueError(f"only valid skills make SFT targets (this one: {result.reason})")
    messages = build_analyzer_messages(trajectory, skill_mode, **prompt_options)
    return [*messages, {"role": "assistant", "content": canonical_answer(result)}]


def canonical_answer(result: SkillResult) -> str:
    """The JSON a valid result stands for, in the fixed key order the prompt shows."""
    answer: dict[str, object] = {"episode_summary": result.summary or "", "episode_skill": result.skill or ""}
    if result.step_skills:
        answer["step_skills"] = {str(k): v for k, v in sorted(result.step_skills.items())}
    return json.dumps(answer, ensure_ascii=False)
