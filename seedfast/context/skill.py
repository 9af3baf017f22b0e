"""How a skill is written into a prompt: the one rendering that SFT and the RL teacher context share.

    S = skill_segment(tokenizer, "Workflow: ... go south -> take passkey. ...")   # ids of "Skill: Workflow: ...\n"
    teacher prompt = P[:k] + S + P[k:]          # k = insertion_index(segments, mode)

Every insertion point of seedfast.context.segments sits right after a newline or before a special token
(prompt segments end with one newline). The rendered skill starts with a letter and ends with one newline,
so inserting its ids at such a point gives the ids of the text with the skill inserted: no BPE merge crosses
either boundary (tests hold the two equal).
"""

from __future__ import annotations

from typing import Literal

SkillKind = Literal["episode", "step"]
LABELS: dict[str, str] = {"episode": "Skill", "step": "Hint for this step"}


def render_skill(text: str, kind: SkillKind = "episode") -> str:
    """The privileged text S for a skill: `"<label>: <text>\\n"`, inner whitespace runs kept as written."""
    if not isinstance(text, str):
        raise TypeError(f"skill text must be a str, got {type(text).__name__}")
    if kind not in LABELS:
        raise ValueError(f"skill kind {kind!r} is not one of {list(LABELS)}")
    body = text.strip()
    if not body:
        raise ValueError("skill text is blank: there is nothing to insert")
    return f"{LABELS[kind]}: {body}\n"


def skill_segment(tokenizer, text: str, kind: SkillKind = "episode",
                  max_tokens: int | None = None) -> list[int]:
    """Token ids of render_skill(text, kind); over `max_tokens`, the skill body is cut from the right and
    the closing newline kept (so the insertion boundaries stay clean)."""
    ids = list(tokenizer.encode(render_skill(text, kind), add_special_tokens=False))
    if max_tokens is None or len(ids) <= max_tokens:
        return ids
    newline = list(tokenizer.encode("\n", add_special_tokens=False))
    if max_tokens <= len(newline):
        raise ValueError(f"max_tokens={max_tokens} leaves no room for any skill text")
    if ids[-len(newline):] != newline:  # a tokenizer that merges the newline into the last word
        ids = list(tokenizer.encode(render_skill(text, kind).rstrip("\n"), add_special_tokens=False))
    return ids[: max_tokens - len(newline)] + newline


class SkillIds:
    """Each skill text rendered and tokenized once: `ids(text)` = skill_segment(tokenizer, text, kind, max_tokens),
    cached by text (a step's episode skill is shared by every step of its trajectory)."""

    def __init__(self, tokenizer, max_tokens: int | None = None, kind: SkillKind = "episode") -> None:
        self.tokenizer, self.max_tokens, self.kind = tokenizer, max_tokens, kind
        self.cache: dict[str, list[int]] = {}

    def __call__(self, text: str) -> list[int]:
        if text not in self.cache:
            self.cache[text] = skill_segment(self.tokenizer, text, self.kind, self.max_tokens)
        return self.cache[text]
