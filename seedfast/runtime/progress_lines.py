"""Progress as plain lines, for a stderr that is not a terminal (a batch job's log, a pipe): one line per step and
one per phase, each flushed at once and stamped with the wall-clock time, e.g.

    [14:02:11] grpo step 3/10 | success 0.500 | reward 0.412 | loss 0.0321 | tokens/s 1,843 | elapsed 21.4 s
    [14:02:12] grpo: checkpoint ckpt/step_3 written (0.1 s)

(docs/reference.md, 'Progress in a log file'). A value that is absent or not finite is left out of the line.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping

_FORMATS = {"success": "{:.3f}", "reward": "{:.3f}", "loss": "{:.4g}", "tokens/s": "{:,.0f}"}


def format_field(name: str, value: float) -> str:
    return f"{name} {_FORMATS.get(name, '{:.4g}').format(value)}"


class ProgressLines:
    """Steps `completed + 1 ... total` of `label` (sft, grpo, seed ...) as lines on stderr."""

    def __init__(self, total: int, label: str, completed: int = 0) -> None:
        self.total, self.label, self.done = total, label, completed
        self.start = time.monotonic()

    def step(self, text: str, fields: Mapping[str, float]) -> None:
        self.done += 1
        parts = [f"{self.label} step {self.done}/{self.total}"]
        if text:
            parts.append(text)
        parts += [format_field(k, float(v)) for k, v in fields.items()
                  if v is not None and math.isfinite(float(v))]
        parts.append(f"elapsed {time.monotonic() - self.start:.1f} s")
        self._print(" | ".join(parts))

    def phase(self, text: str) -> None:
        self._print(f"{self.label}: {text}")

    @staticmethod
    def _print(line: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)
