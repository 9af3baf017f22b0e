"""SEED stage 1 data: roll a policy out on M tasks x K0 trajectories, label each trajectory with an analyzer,
and write the (analyzer prompt -> skill JSON) pairs for skill SFT. A library with explicit arguments; the
`seedfast collect` command (seedfast/app/collect.py) builds them from the config.

Output folder (`out_dir`), every file written atomically (tmp + rename):
    skill_sft.jsonl     one line per trajectory whose skill parsed: {"messages": [system, user, assistant],
                        "game_id", "trajectory_index", "won"}; the assistant turn is the canonical skill JSON
    trajectories.jsonl  every trajectory (Trajectory.to_dict()) with its label: {"skill": {valid, reason, ...}}
    stats.json          rollout counters, success rate, and the parse statistics (count per reason)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from seedfast.envs.slots import EnvSlots
from seedfast.envs.trajectory import Trajectory
from seedfast.rollout.agent_loop import AgentLoopConfig, Task, run_agent_loop
from seedfast.rollout.records import RolloutStats
from seedfast.skills.prompts import analyzer_sft_messages
from seedfast.skills.result import SkillResult, count_reasons

PAIRS_FILE = "skill_sft.jsonl"  # in the output folder: what `seedfast sft` reads when sft.data is unset


@dataclass
class CollectSummary:
    out_dir: str
    trajectories: int
    kept_pairs: int
    reasons: dict[str, int]
    rollout: dict[str, float]


def collect_skill_data(
    engine,
    tokenizer,
    tasks: Sequence[Task],
    envs: EnvSlots,
    analyzer,
    out_dir: str | os.PathLike,
    agent_config: AgentLoopConfig,
    *,
    tasks_per_batch: int | None = None,
    skill_mode: str = "episode_only",
) -> CollectSummary:
    """Roll out `agent_config.n` trajectories per task, `tasks_per_batch` tasks at a time, on `envs` (one pool for
    every batch: at least tasks_per_batch x n slots; the caller closes it); label every trajectory with
    `analyzer.analyze`; write the output folder."""
    if not tasks:
        raise ValueError("tasks is empty: collect needs at least one task")
    per_batch = tasks_per_batch or len(tasks)
    trajectories: list[Trajectory] = []
    totals = RolloutStats()
    for start in range(0, len(tasks), per_batch):
        batch = list(tasks[start : start + per_batch])
        result = run_agent_loop(engine, tokenizer, batch, envs, agent_config)
        for trajectory in result.trajectories:
            trajectory.meta["trajectory_index"] = len(trajectories)
            trajectory.meta["group_id"] += start
            trajectories.append(trajectory)
        _accumulate(totals, result.stats)
    labels = analyzer.analyze(trajectories)
    if len(labels) != len(trajectories):
        raise RuntimeError(f"the analyzer returned {len(labels)} results for {len(trajectories)} trajectories")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pairs = [_sft_line(t, label, skill_mode) for t, label in zip(trajectories, labels) if label.valid]
    write_jsonl_atomic(out / PAIRS_FILE, pairs)
    write_jsonl_atomic(out / "trajectories.jsonl",
                       ({**t.to_dict(), "skill": _label_dict(label)} for t, label in zip(trajectories, labels)))
    summary = CollectSummary(str(out), len(trajectories), len(pairs), count_reasons(labels), totals.as_dict())
    write_text_atomic(out / "stats.json", json.dumps(asdict(summary), indent=2) + "\n")
    return summary


def _accumulate(total: RolloutStats, part: RolloutStats) -> None:
    for name, value in asdict(part).items():
        setattr(total, name, getattr(total, name) + value)


def _sft_line(trajectory: Trajectory, label: SkillResult, skill_mode: str) -> dict[str, Any]:
    return {
        "messages": analyzer_sft_messages(trajectory, label, skill_mode),
        "game_id": trajectory.game_id,
        "trajectory_index": trajectory.meta["trajectory_index"],
        "won": trajectory.won,
    }


def _label_dict(label: SkillResult) -> dict[str, Any]:
    out = asdict(label)
    out["step_skills"] = {str(k): v for k, v in label.step_skills.items()}
    return out


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_jsonl_atomic(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    write_text_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
