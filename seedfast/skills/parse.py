"""Parse and validate an analyzer's answer: find the JSON, check the skill is usable, say why if not.

Accepts what models actually write: code fences, text before or after the object, a <think> block,
trailing commas. Rejects skills that cannot help: blank, placeholder, a few words, an echo of the task.
"""

from __future__ import annotations

import json
import re
from typing import Any

from seedfast.skills.prompts import PLACEHOLDERS
from seedfast.skills.result import MAX_STEP_SKILLS, SkillResult, check_skill_mode, invalid

MAX_RAW_CHARS = 20_000
_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_WORD = re.compile(r"[a-z0-9]+")
_KEYS = ("episode_skill", "step_skills", "episode_summary")


def extract_json_object(text: str) -> dict[str, Any] | None:
    """The analyzer's JSON object in `text`: the first one with an expected key, else the first one."""
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    text = text[:MAX_RAW_CHARS]
    found: list[dict[str, Any]] = []
    for candidate in [*_FENCE.findall(text), text]:
        for variant in (candidate, _TRAILING_COMMA.sub(r"\1", candidate)):
            found.extend(_objects_in(variant))
        for obj in found:
            if any(key in obj for key in _KEYS):
                return obj
    return found[0] if found else None


def _objects_in(text: str) -> list[dict[str, Any]]:
    decoder = json.JSONDecoder()
    objects, start = [], text.find("{")
    while start != -1:
        try:
            obj, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(obj, dict):
            objects.append(obj)
        start = text.find("{", end)
    return objects


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def skill_problem(skill: Any, task: str | None = None, min_words: int = 4, max_chars: int = 1200) -> str | None:
    """Why `skill` is not a usable skill text (a reason of result.REASONS), or None if it is."""
    if not isinstance(skill, str):
        return "wrong_type"
    text = skill.strip()
    if not text:
        return "empty"
    if text in PLACEHOLDERS or re.fullmatch(r"<[^<>]*>", text):
        return "copied_template"
    skill_words = words(text)
    if len(skill_words) < min_words:
        return "too_short"
    if len(text) > max_chars:
        return "too_long"
    if task:
        task_words = set(words(task))
        if sum(w in task_words for w in skill_words) >= 0.9 * len(skill_words):
            return "echo_task"
    return None


def parse_step_skills(value: Any, n_steps: int | None) -> tuple[dict[int, str], int]:
    """Valid step skills ({0-based step: sentence}, at most MAX_STEP_SKILLS, lowest steps first) and
    how many entries were dropped."""
    if not isinstance(value, dict):
        return {}, 0 if value is None else 1
    kept: dict[int, str] = {}
    dropped = 0
    for key, sentence in value.items():
        try:
            step = int(key)
        except (TypeError, ValueError):
            step = -1
        ok = (step >= 0 and (n_steps is None or step < n_steps) and str(key).strip().lstrip("+").isdigit()
              and isinstance(sentence, str) and len(words(sentence)) >= 2 and len(sentence) <= 300
              and step not in kept)
        if ok:
            kept[step] = " ".join(sentence.split())
        else:
            dropped += 1
    ordered = dict(sorted(kept.items())[:MAX_STEP_SKILLS])
    return ordered, dropped + len(kept) - len(ordered)


def parse_skill_response(raw: str, task: str | None = None, n_steps: int | None = None,
                         skill_mode: str = "episode_only", min_words: int = 4,
                         max_chars: int = 1200) -> SkillResult:
    """One analyzer answer -> SkillResult (valid, or invalid with the first reason found)."""
    if not isinstance(raw, str):
        raise TypeError(f"raw must be a str, got {type(raw).__name__}")
    check_skill_mode(skill_mode)
    obj = extract_json_object(raw)
    if obj is None:
        return invalid("no_json", raw)
    summary = obj.get("episode_summary")
    summary = " ".join(summary.split()) if isinstance(summary, str) and summary.strip() else None
    step_skills, dropped = ({}, 0) if skill_mode == "episode_only" else parse_step_skills(
        obj.get("step_skills"), n_steps)

    skill = obj.get("episode_skill")
    problem = "missing_key" if "episode_skill" not in obj else skill_problem(skill, task, min_words, max_chars)
    if skill_mode == "step_only":
        if not step_skills:
            has_wrong_type = "step_skills" in obj and not isinstance(obj["step_skills"], dict)
            return invalid("wrong_type" if has_wrong_type else "no_step_skills", raw)
        skill = None if problem else skill
    elif problem:
        return invalid(problem, raw)
    skill = " ".join(skill.split()) if isinstance(skill, str) else None
    return SkillResult(skill=skill, step_skills=step_skills, valid=True, reason="ok", raw=raw,
                       summary=summary, n_dropped_step_skills=dropped)
