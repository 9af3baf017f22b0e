"""Metrics: one JSON line per step (RL: `metrics.jsonl`, SFT: `sft_metrics.jsonl`; runtime/paths.py), its scalars
mirrored to TensorBoard (log.tensorboard) and W&B (log.wandb_project); event rows (what is not a step) go to the JSON
lines only.

On resume the log is cut back to the checkpointed step, so a run killed after logging step n but before
checkpointing it does not log step n twice; a torn last line (killed mid-write) is dropped too.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

from seedfast.runtime.paths import RunPaths


def _clean(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them visible instead of failing
    return value


def truncate_metrics(path: str | Path, last_step: int) -> None:
    """Keep only complete lines whose step is <= last_step (atomically)."""
    path = Path(path)
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("step", -1) <= last_step:
            kept.append(line)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(x + "\n" for x in kept))
    os.replace(tmp, path)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class MetricsLogger:
    """The JSON lines `path` (default: RL's, RunPaths.metrics), TensorBoard events under `tb_dir` (default: RL's,
    RunPaths.tb) and a W&B run in `run_dir`: `log` writes a step to all three, `event` to the JSON lines only.
    `fresh` starts the JSON lines afresh (else they are appended to: a resumed run cuts them back first,
    truncate_metrics)."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True, wandb_project: str | None = None,
                 config: dict[str, Any] | None = None, *, path: Path | None = None, tb_dir: Path | None = None,
                 fresh: bool = False):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        paths = RunPaths(self.run_dir)
        self.path = paths.metrics if path is None else path
        tb_dir = paths.tb if tb_dir is None else tb_dir
        if fresh:
            self.path.write_text("")
        self._tb = None
        self._wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(tb_dir))
            except ImportError:  # tensorboard is an optional extra: say so, once per logger, instead of silence
                warnings.warn("log.tensorboard=true, but the tensorboard package is not installed "
                              "(pip install -e '.[report]'): no TensorBoard events are written", stacklevel=2)
        if wandb_project:
            import wandb  # optional; only when configured

            self._wandb = wandb.init(project=wandb_project, dir=str(self.run_dir), config=config or {})

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self._append(row)
        scalars = {k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "step"}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def event(self, row: dict[str, Any]) -> None:
        """A row that is not a step (e.g. the data's counts, a summary): the JSON lines only."""
        self._append({k: _clean(v) for k, v in row.items()})

    def _append(self, row: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


class NullLogger:
    """What ranks other than 0 of a sharded run log to: nothing (rank 0 writes the metrics and TensorBoard)."""

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def event(self, row: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass
