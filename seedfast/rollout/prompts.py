"""Per-step agent prompts as token segments, so every insertion point is known in tokens (docs/algorithms.md,
'Samples and rewards').

The prompt is the tokenizer's own chat template over two messages, system and user; the user message is
the task, the last `history_k` (observation, action) turns, the current observation with the admissible
actions, and the instructions. The templated text is tokenized once, as a whole, and its tokens are cut
at the pieces' character boundaries, so the concatenated segments are exactly the ids the chat template
gives (whatever the tokenizer) and the scorer sees the very tokens the policy saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from seedfast.context.segments import Segment, insert_points

DEFAULT_SYSTEM = "You are an agent playing a text adventure game. Reach the goal with as few actions as possible."
DEFAULT_INSTRUCTIONS = (
    "Now it's your turn. Think briefly inside <think></think>, then give exactly one admissible action "
    "inside <action></action>.\n"
)
UNPARSABLE_FEEDBACK = "No action was found in your answer: write one admissible action inside <action></action>."


@dataclass(frozen=True)
class Turn:
    """One past step as the prompt shows it: what the agent saw and what it did."""

    observation: str
    action: str


@dataclass(frozen=True)
class PromptStyle:
    system: str = DEFAULT_SYSTEM
    instructions: str = DEFAULT_INSTRUCTIONS
    history_k: int = 2
    show_admissible: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.history_k, bool) or not isinstance(self.history_k, int) or self.history_k < 0:
            raise ValueError(f"history_k must be an int >= 0, got {self.history_k!r}")


@dataclass(frozen=True)
class Prompt:
    """A tokenized prompt: `segments` ((kind, ids) pieces, kinds of seedfast.context.segments)."""

    segments: tuple[Segment, ...]
    text: str

    @property
    def ids(self) -> list[int]:
        return [t for _, ids in self.segments for t in ids.tolist()]

    def insert_points(self) -> dict[str, int]:
        """Token index of every insertion mode (after_task, before_response, prepend) in `ids`."""
        return insert_points(self.segments)


def _line_block(text: str) -> str:
    # every piece but the last ends with exactly one newline: token boundaries then fall between pieces
    return text.strip() + "\n"


def user_parts(
    task: str,
    history: Sequence[Turn],
    observation: str,
    admissible: Sequence[str],
    step_index: int,
    style: PromptStyle,
) -> list[tuple[str, str]]:
    """(kind, text) pieces of the user message, in prompt order."""
    parts = [("task", _line_block(f"Your task: {task}"))]
    window = list(history)[-style.history_k :] if style.history_k else []
    first = step_index - len(window)
    for i, turn in enumerate(window):
        parts.append(
            ("history", _line_block(f"[Step {first + i + 1}] Observation: {turn.observation}\nAction: {turn.action}"))
        )
    current = f"[Step {step_index + 1}] Current observation: {observation}"
    if style.show_admissible:
        current += "\nAdmissible actions: " + ", ".join(admissible)
    parts.append(("observation", _line_block(current)))
    # the user message ends without whitespace: templates that trim it (Llama 3's) leave it as it is
    parts.append(("instructions", style.instructions.strip()))
    return parts


def build_prompt(
    tokenizer,
    task: str,
    history: Sequence[Turn],
    observation: str,
    admissible: Sequence[str],
    step_index: int,
    style: PromptStyle | None = None,
) -> Prompt:
    """The chat-templated prompt of one agent step, cut into segments (see module docstring)."""
    style = style or PromptStyle()
    for name, value in (("task", task), ("observation", observation)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    parts = user_parts(task, history, observation, admissible, step_index, style)
    content = "".join(text for _, text in parts)
    messages = [{"role": "system", "content": style.system}, {"role": "user", "content": content}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    start = text.rfind(content)
    if start < 0:
        raise ValueError("the tokenizer's chat template changed the user message; cannot locate its pieces")
    # character ranges: template glue up to the user text is "system", glue after it "instructions"
    bounds, position = [("system", 0, start)], start
    for kind, piece in parts:
        bounds.append((kind, position, position + len(piece)))
        position += len(piece)
    kind, first, _ = bounds[-1]
    bounds[-1] = (kind, first, len(text))
    return Prompt(_cut_tokens(tokenizer, text, bounds), text)


def _cut_tokens(tokenizer, text: str, bounds: list[tuple[str, int, int]]) -> tuple[Segment, ...]:
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError("build_prompt needs a fast (Rust) tokenizer: it cuts tokens by their character offsets")
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    pieces: list[list[int]] = [[] for _ in bounds]
    which = 0
    for token, (begin, _) in zip(enc["input_ids"], enc["offset_mapping"]):
        # a token belongs to the piece its first character is in (a token never moves backwards)
        while which + 1 < len(bounds) and begin >= bounds[which + 1][1]:
            which += 1
        pieces[which].append(token)
    return tuple(
        Segment(kind, torch.tensor(ids, dtype=torch.long)) for (kind, _, _), ids in zip(bounds, pieces) if ids
    )
