"""SFT examples: token ids + loss mask, from walkthrough replays and from `seedfast collect` JSONL.

Three kinds, each built exactly as the policy will later be asked:
- behaviour cloning (`bc`): the agent loop's prompt of every walkthrough step (rollout.prompts, same
  history window and truncation), answered with `<action>CMD</action>` and the end-of-turn token that
  stops generation; `bc_skill`: the same prompt in the RL teacher's context, holding a skill the analyzers
  write for a trajectory of that game, placed and rendered as the RL teacher places it (docs/demo.md, 'The
  skill the policy reads is the skill the analyzers write').
- skill writing (`skill`): the analyzer prompt of a trajectory (skills.prompts, shortened like the self
  analyzer does) answered with the oracle's canonical JSON, on successes and a few failures.
- `jsonl`: (messages -> answer) pairs from a file, e.g. <run_dir>/collect/skill_sft.jsonl.

A loss mask marks the tokens that are targets: always the answer, the prompt too with `prompt_loss`
(token 0 never: nothing predicts it). Prompts over the limit lose tokens from the left, never the answer.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seedfast.context.segments import INSERTION_MODES
from seedfast.context.skill import SkillIds
from seedfast.context.teacher import build_step_sample, place_skills
from seedfast.envs.trajectory import Trajectory
from seedfast.rollout.prompts import Prompt, PromptStyle, Turn, build_prompt
from seedfast.skills.analyzers import _PROMPT_SHAPES, OracleAnalyzer
from seedfast.skills.policy_text import chat_prompt_ids
from seedfast.skills.prompts import build_analyzer_messages, canonical_answer
from seedfast.skills.result import SkillResult, teacher_texts

END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")
EXAMPLE_KINDS = ("bc", "bc_skill", "skill", "jsonl", "copy")


@dataclass(frozen=True)
class SFTExample:
    input_ids: list[int]
    loss_mask: list[bool]  # loss_mask[t]: token t is a target (predicted from tokens < t)
    kind: str
    source: str  # e.g. "treasure_hunter-L3-0 step 1", "skill_sft.jsonl:12"
    truncated: bool = False  # prompt shortened (history dropped or tokens cut) to fit the limit
    answer_start: int = 0  # index of the first answer token (tokens before it are the prompt)

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError(f"example {self.source!r}: {len(self.input_ids)} ids but {len(self.loss_mask)} "
                             "loss-mask entries")
        if self.kind not in EXAMPLE_KINDS:
            raise ValueError(f"example {self.source!r}: kind {self.kind!r} is not one of {EXAMPLE_KINDS}")

    @property
    def n_loss_tokens(self) -> int:
        return sum(self.loss_mask)


def make_example(prompt_ids: Sequence[int], answer_ids: Sequence[int], *, kind: str, source: str,
                 prompt_loss: bool = False, max_prompt_tokens: int | None = None,
                 truncated: bool = False) -> SFTExample:
    """prompt + answer, the prompt cut from the left to `max_prompt_tokens`; loss on the answer (+ prompt)."""
    if not answer_ids:
        raise ValueError(f"example {source!r}: the answer is empty")
    prompt = list(prompt_ids)
    if max_prompt_tokens is not None and len(prompt) > max_prompt_tokens:
        prompt, truncated = prompt[len(prompt) - max_prompt_tokens:], True
    mask = [prompt_loss and i > 0 for i in range(len(prompt))] + [True] * len(answer_ids)
    mask[0] = False
    return SFTExample(prompt + list(answer_ids), mask, kind, source, truncated, answer_start=len(prompt))


def end_of_turn_id(tokenizer: Any) -> int:
    """The id that closes an assistant turn (and stops generation): <|im_end|> and kin, else eos."""
    vocab = tokenizer.get_vocab()
    for token in END_OF_TURN_TOKENS:
        if token in vocab:
            return vocab[token]
    if isinstance(tokenizer.eos_token_id, int):
        return tokenizer.eos_token_id
    raise ValueError("the tokenizer has no end-of-turn token and no eos_token_id: answers could not end")


def action_response_ids(tokenizer: Any, action: str) -> list[int]:
    """What the policy should generate for `action`: `<action>CMD</action>` then the end-of-turn id."""
    return list(tokenizer.encode(f"<action>{action}</action>", add_special_tokens=False)) + [
        end_of_turn_id(tokenizer)]


def fit_prompt(tokenizer: Any, task: str, history: Sequence[Turn], observation: str,
               admissible: Sequence[str], step_index: int, style: PromptStyle,
               limit: int | None) -> tuple[Prompt, bool]:
    """The agent loop's prompt; over `limit` tokens, history turns are dropped from the left as it does.

    Returns (prompt, shortened). Without any history the prompt may still be over the limit.
    """
    prompt = build_prompt(tokenizer, task, history, observation, admissible, step_index, style)
    if limit is None or len(prompt.ids) <= limit:
        return prompt, False
    for k in range(min(style.history_k, len(history)) - 1, -1, -1):
        prompt = build_prompt(tokenizer, task, history, observation, admissible, step_index,
                              dataclasses.replace(style, history_k=k))
        if len(prompt.ids) <= limit:
            break
    return prompt, True


def bc_examples(tokenizer: Any, trajectories: Sequence[Trajectory], *, style: PromptStyle,
                max_prompt_tokens: int | None = None, prompt_loss: bool = False,
                skill_insertion: str | None = None, skill_fraction: float = 0.0,
                max_skill_tokens: int | None = None, seed: int = 0,
                skills: Sequence[Sequence[SkillResult]] | None = None, skill_mode: str = "episode_only",
                teacher_mode: str = "step_priority") -> list[SFTExample]:
    """One `bc` example per step of each trajectory, plus `bc_skill` copies of a `skill_fraction` share of
    them (chosen with `seed`) whose prompt is the RL teacher's context of that step.

    The trajectories' actions are the targets (walkthroughs). `skills[j]` are the analyzer results the copies
    of trajectory j may read, one drawn per copy with `seed` (default: the oracle analyzer's result for
    trajectory j, what the RL teacher gives a winner). A copy holds what the teacher would insert for the
    drawn result under `skill_mode` and `teacher_mode`: the episode skill at `skill_insertion`, a step skill
    late, rendered by context.skill.SkillIds with `max_skill_tokens` (train/batch.py does the same). A skill
    prompt fits `max_prompt_tokens` with the skill counted, history dropped first (docs/algorithms.md,
    'Teacher context and insertion points'); a copy whose drawn result gives this step nothing is left out.
    """
    if skill_insertion is not None and skill_insertion not in INSERTION_MODES:
        raise ValueError(f"skill_insertion {skill_insertion!r} is not one of {INSERTION_MODES}")
    if not 0.0 <= skill_fraction <= 1.0:
        raise ValueError(f"skill_fraction must be in [0, 1], got {skill_fraction!r}")
    if skills is not None and len(skills) != len(trajectories):
        raise ValueError(f"skills has {len(skills)} entries for {len(trajectories)} trajectories")
    steps = [(j, i) for j, t in enumerate(trajectories) for i in range(len(t.steps))]
    plain = [_bc_example(tokenizer, trajectories[j], i, style, max_prompt_tokens, prompt_loss) for j, i in steps]
    if skill_insertion is None or skill_fraction == 0.0:
        return plain
    rng = random.Random(seed)
    chosen = sorted(rng.sample(range(len(steps)), round(skill_fraction * len(steps))))
    if skills is None:
        skills = [[r] for r in OracleAnalyzer(skill_mode).analyze(list(trajectories))]
    ids = SkillIds(tokenizer, max_tokens=max_skill_tokens)
    with_skill = []
    for k in chosen:
        j, i = steps[k]
        readable = [r for r in skills[j] if r.valid]
        if not readable:
            continue
        episode, step_skills = teacher_texts(rng.choice(readable), skill_mode)
        teacher = _TeacherSkills(skill_insertion, episode, step_skills.get(i), teacher_mode, ids)
        example = _bc_skill_example(tokenizer, trajectories[j], i, style, max_prompt_tokens, prompt_loss, teacher)
        if example is not None:
            with_skill.append(example)
    return plain + with_skill


@dataclass(frozen=True)
class _TeacherSkills:
    """What the RL teacher inserts in one step's prompt: texts, where they go, and how they become ids."""

    insertion: str
    episode: str | None
    step: str | None
    teacher_mode: str
    ids: SkillIds

    def pieces(self, points: dict[str, int]) -> list[tuple[str, list[int]]]:
        placed = place_skills(points, self.insertion, self.episode, self.step, self.teacher_mode)
        return [(mode, self.ids(text)) for mode, text in placed]


def _bc_example(tokenizer: Any, trajectory: Trajectory, index: int, style: PromptStyle, limit: int | None,
                prompt_loss: bool) -> SFTExample:
    step = trajectory.steps[index]
    history = [Turn(s.observation, s.action) for s in trajectory.steps[:index]]
    prompt, shortened = fit_prompt(tokenizer, trajectory.task, history, step.observation, step.admissible_actions,
                                   index, style, limit)
    return make_example(prompt.ids, action_response_ids(tokenizer, step.action), kind="bc",
                        source=f"{trajectory.game_id} step {index}", prompt_loss=prompt_loss,
                        max_prompt_tokens=limit, truncated=shortened)


def _bc_skill_example(tokenizer: Any, trajectory: Trajectory, index: int, style: PromptStyle, limit: int | None,
                      prompt_loss: bool, teacher: _TeacherSkills) -> SFTExample | None:
    step = trajectory.steps[index]
    history = [Turn(s.observation, s.action) for s in trajectory.steps[:index]]
    answer = action_response_ids(tokenizer, step.action)
    # the pieces' lengths do not depend on the prompt: measure them on the untruncated one
    full = build_prompt(tokenizer, trajectory.task, history, step.observation, step.admissible_actions, index, style)
    length = sum(len(ids) for _, ids in teacher.pieces(full.insert_points()))
    if length == 0:
        return None
    budget = None if limit is None else max(limit - length, 0)
    prompt, shortened = fit_prompt(tokenizer, trajectory.task, history, step.observation, step.admissible_actions,
                                   index, style, budget)
    # the scorer's own splice (context.sample.StepSample): the teacher prompt RL scores, token for token
    sample, _ = build_step_sample(prompt.segments, answer, teacher.pieces(prompt.insert_points()))
    return make_example(sample.teacher_prompt_ids().tolist(), answer, kind="bc_skill",
                        source=f"{trajectory.game_id} step {index}", prompt_loss=prompt_loss,
                        max_prompt_tokens=limit, truncated=shortened)


def analyzer_prompt_ids(tokenizer: Any, trajectory: Trajectory, skill_mode: str = "episode_only",
                        max_prompt_tokens: int | None = None) -> list[int] | None:
    """The analyzer prompt's ids, shortened as the self analyzer shortens it; None when it never fits."""
    for max_steps, max_chars in _PROMPT_SHAPES:
        messages = build_analyzer_messages(trajectory, skill_mode, max_chars, max_steps)
        ids = chat_prompt_ids(tokenizer, messages)
        if max_prompt_tokens is None or len(ids) <= max_prompt_tokens:
            return ids
    return None


def skill_writing_examples(tokenizer: Any, trajectories: Sequence[Trajectory], *,
                           skill_mode: str = "episode_only",
                           max_prompt_tokens: int | None = None) -> tuple[list[SFTExample], Counter]:
    """(analyzer prompt -> oracle canonical JSON) examples, loss on the answer only.

    Returns the examples and why trajectories were left out (the oracle's parse reasons, and
    `prompt_too_long`: a trajectory the self analyzer would not be asked about either).
    """
    results = OracleAnalyzer(skill_mode).analyze(list(trajectories))
    examples, skipped = [], Counter()
    for trajectory, result in zip(trajectories, results):
        if not result.valid:
            skipped[result.reason] += 1
            continue
        prompt = analyzer_prompt_ids(tokenizer, trajectory, skill_mode, max_prompt_tokens)
        if prompt is None:
            skipped["prompt_too_long"] += 1
            continue
        answer = list(tokenizer.encode(canonical_answer(result), add_special_tokens=False))
        outcome = "success" if trajectory.won else "failure"
        source = f"{trajectory.game_id} {outcome} ({len(trajectory.steps)} steps)"
        answer.append(end_of_turn_id(tokenizer))
        examples.append(make_example(prompt, answer, kind="skill", source=source))
    return examples, skipped


def read_pairs(path: str | Path) -> list[tuple[list[dict[str, str]], str, str]]:
    """(prompt messages, answer, source) per line of a JSONL file.

    A line is {"messages": [..., {"role": "assistant", "content": ANSWER}]} (seedfast collect's
    skill_sft.jsonl) or {"messages": [...prompt...], "answer": ANSWER}; blank lines are skipped.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SFT data file {str(path)!r} does not exist")
    pairs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path.name}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not valid JSON ({err.msg})") from None
        pairs.append((*_pair_of(record, f"{path}:{number}"), where))
    return pairs


def _pair_of(record: Any, where: str) -> tuple[list[dict[str, str]], str]:
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        raise ValueError(f"{where}: expected an object with a 'messages' list")
    messages = record["messages"]
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ValueError(f"{where}: messages[{i}] must be an object with string 'role' and 'content'")
    if "answer" in record:
        answer = record["answer"]
        if not isinstance(answer, str):
            raise ValueError(f"{where}: 'answer' must be a string, got {type(answer).__name__}")
        prompt = messages
    else:
        if not messages or messages[-1]["role"] != "assistant":
            raise ValueError(f"{where}: without an 'answer' key, the last message must be the assistant's")
        prompt, answer = messages[:-1], messages[-1]["content"]
    if not prompt or prompt[-1]["role"] == "assistant":
        raise ValueError(f"{where}: the prompt messages must end with a non-assistant turn")
    if not answer.strip():
        raise ValueError(f"{where}: the answer is empty")
    return [dict(m) for m in prompt], answer


def jsonl_examples(tokenizer: Any, path: str | Path, *,
                   max_prompt_tokens: int | None = None) -> list[SFTExample]:
    """Examples from a JSONL of (messages -> answer) pairs (see read_pairs); loss on the answer only."""
    eot = end_of_turn_id(tokenizer)
    return [make_example(chat_prompt_ids(tokenizer, prompt),
                         list(tokenizer.encode(answer, add_special_tokens=False)) + [eot],
                         kind="jsonl", source=source, max_prompt_tokens=max_prompt_tokens)
            for prompt, answer, source in read_pairs(path)]


def summarize(examples: Sequence[SFTExample]) -> dict[str, int]:
    """Counts for logs: examples and tokens per kind, loss tokens, truncated prompts."""
    out: dict[str, int] = {"examples": len(examples), "tokens": sum(len(e.input_ids) for e in examples),
                           "loss_tokens": sum(e.n_loss_tokens for e in examples),
                           "truncated": sum(e.truncated for e in examples)}
    for kind in EXAMPLE_KINDS:
        out[f"examples/{kind}"] = sum(e.kind == kind for e in examples)
    return out
