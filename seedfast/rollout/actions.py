"""Pull the action out of a policy response: `<action>...</action>`, last tag wins."""

from __future__ import annotations

import re

_CLOSED = re.compile(r"<action>(.*?)</action>", re.IGNORECASE | re.DOTALL)
_OPEN = re.compile(r"<action>", re.IGNORECASE)


def parse_action(text: str) -> str | None:
    """The command inside the last `<action>` tag, whitespace-normalized; None when there is none.

    Tolerant: a final tag left unclosed (generation stopped at the end-of-turn token or the length limit)
    still counts when it follows the last closed tag and is not empty; an empty tag is unparsable.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_action expects the response text as str, got {type(text).__name__}")
    action = None
    last_end = 0
    for match in _CLOSED.finditer(text):
        action, last_end = _normalize(match.group(1)), match.end()
    opens = list(_OPEN.finditer(text, last_end))
    if opens:
        action = _normalize(text[opens[-1].end():]) or action
    return action


def _normalize(command: str) -> str | None:
    return " ".join(command.split()) or None
