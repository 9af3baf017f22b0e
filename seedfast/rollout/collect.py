"""`seedfast collect`: SEED stage 1 data. Roll the base policy out on M tasks x K0 trajectories, label each
trajectory with an analyzer, and write the (analyzer prompt -> skill JSON) pairs for skill SFT.

Output folder (`collect.out`, default <run_dir>/collect), every file written atomically (tmp + rename):
    skill_sft.jsonl     one line per trajectory whose skill parsed: {"messages": [system, user, assistant],
                        "game_id", "trajectory_index", "won"}; the assistant turn is the canonical skill JSON
    trajectories.jsonl  every trajectory (Trajectory.to_dict()) with its label: {"skill": {valid, reason, ...}}
    stats.json          rollout counters, success rate, and the parse statistics (count per reason)
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from seedfast.envs.trajectory import Trajectory
from seedfast.rollout.agent_loop import AgentLoopConfig, Task, run_agent_loop
from seedfast.rollout.env_slots import EnvSlots
from seedfast.rollout.prompts import PromptStyle
from seedfast.rollout.records import RolloutStats
from seedfast.skills.prompts import analyzer_sft_messages
from seedfast.skills.result import SkillResult, count_reasons


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
    make_envs: Callable[[int], EnvSlots],
    analyzer,
    out_dir: str | os.PathLike,
    agent_config: AgentLoopConfig,
    *,
    tasks_per_batch: int | None = None,
    skill_mode: str = "episode_only",
) -> CollectSummary:
    """Roll out `agent_config.n` trajectories per task, `tasks_per_batch` tasks at a time, on slots made by
    `make_envs(n_slots)`; label every trajectory with `analyzer.analyze`; write the output folder."""
    if not tasks:
        raise ValueError("tasks is empty: collect needs at least one task")
    per_batch = tasks_per_batch or len(tasks)
    trajectories: list[Trajectory] = []
    totals = RolloutStats()
    for start in range(0, len(tasks), per_batch):
        batch = list(tasks[start : start + per_batch])
        envs = make_envs(len(batch) * agent_config.n)
        try:
            result = run_agent_loop(engine, tokenizer, batch, envs, agent_config)
        finally:
            if hasattr(envs, "close"):
                envs.close()
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
    write_jsonl_atomic(out / "skill_sft.jsonl", pairs)
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


# ---- `seedfast collect CONFIG`: the config wired to the pieces above ----


def main(cfg: Any, **_flags: Any) -> int:
    """Entry point of `seedfast collect` (cfg: seedfast.config.Config)."""
    from seedfast.envs.workers import EnvPool
    from seedfast.rollout.env_slots import PoolEnvSlots

    engine, tokenizer = build_engine(cfg)  # first: a missing policy fails before any game is made
    tasks = _tasks(cfg)
    agent_config = AgentLoopConfig(
        n=cfg.collect.rollouts_per_task,
        max_steps=cfg.env.max_steps,
        max_new_tokens=cfg.rollout.max_response_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        invalid_penalty=cfg.env.invalid_penalty,
        max_prompt_tokens=cfg.rollout.max_prompt_length,
        style=PromptStyle(history_k=cfg.env.history_k),
    )
    factory = _env_factory(cfg)

    def make_envs(n_slots: int) -> EnvSlots:
        return PoolEnvSlots(EnvPool(n_slots, env_factory=factory, step_timeout=cfg.env.step_timeout_s))

    out_dir = Path(cfg.collect.out) if cfg.collect.out else cfg.run_dir / "collect"
    summary = collect_skill_data(
        engine, tokenizer, tasks, make_envs, _analyzer(cfg, engine, tokenizer), out_dir, agent_config,
        tasks_per_batch=cfg.rollout.tasks_per_batch, skill_mode=cfg.skill.skill_mode,
    )
    rollout = summary.rollout
    print(f"collected {summary.trajectories} trajectories on {len(tasks)} tasks "
          f"(success {rollout['success_rate']:.1%}, invalid actions {rollout['invalid_rate']:.1%}); "
          f"{summary.kept_pairs} skill pairs kept; reasons {summary.reasons}; -> {summary.out_dir}")
    return 0


def _tasks(cfg: Any) -> list[Task]:
    if cfg.env.kind == "alfworld":
        from seedfast.envs.alfworld import list_alfworld_games

        games = list_alfworld_games("train", cfg.env.games_dir)[: cfg.collect.tasks]
        return [Task(Path(g).parent.name, g) for g in games]
    from seedfast.envs.textworld_games import make_games

    workers = cfg.env.workers or os.cpu_count() or 1
    records = make_games(cfg.env.games_dir, cfg.env.game_type, cfg.env.levels, cfg.env.n_train, 0,
                         seed=cfg.env.games_seed, workers=workers)
    if len(records) < cfg.collect.tasks:
        print(f"collect.tasks={cfg.collect.tasks} but only {len(records)} training games exist "
              f"(env.n_train x levels); using all of them", file=sys.stderr)
    return [Task.from_record(r) for r in records[: cfg.collect.tasks]]


def _env_factory(cfg: Any):
    if cfg.env.kind == "alfworld":
        from seedfast.envs.alfworld import AlfWorldEnv

        return AlfWorldEnv
    from seedfast.envs.textworld_env import TextWorldEnv

    return TextWorldEnv


def policy_path(cfg: Any) -> Path:
    """The base policy collect rolls out: trainer.init_from, else model.path, else <run_dir>/hf."""
    for key, value in (("trainer.init_from", cfg.trainer.init_from), ("model.path", cfg.model.path)):
        if value:
            path = Path(value)
            if not (path / "config.json").is_file():
                raise ValueError(f"{key}={value!r} is not an HF model folder (no config.json)")
            return path
    exported = cfg.run_dir / "hf"
    if (exported / "config.json").is_file():
        return exported
    raise ValueError(
        f"collect needs a policy: set model.path (or trainer.init_from) to an HF model folder; "
        f"there is none at {exported} either"
    )


def build_engine(cfg: Any):
    """(engine, tokenizer) for the config's policy: the own KV-cache Sampler or vLLM."""
    import torch

    from seedfast.model.tokenizer import load_tokenizer

    path = policy_path(cfg)
    tok_path = cfg.model.tokenizer
    if not tok_path:
        tok_path = path if (path / "tokenizer_config.json").is_file() else cfg.run_dir / "tokenizer"
    tokenizer = load_tokenizer(tok_path)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[cfg.model.dtype]
    if cfg.rollout.engine == "vllm":
        from seedfast.rollout.vllm_engine import VLLMEngine

        engine = VLLMEngine(str(path), dtype=cfg.model.dtype, seed=cfg.run.seed,
                            gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
                            tensor_parallel_size=cfg.rollout.tensor_parallel)
        return engine, tokenizer
    from seedfast.model import load_hf
    from seedfast.rollout.sampler import Sampler

    device = cfg.trainer.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_hf(path, dtype=dtype, device=device)
    model.attn_backend = cfg.model.attn_backend
    return Sampler(model, seed=cfg.run.seed), tokenizer


def _analyzer(cfg: Any, engine, tokenizer):
    from seedfast.skills.analyzers import make_analyzer

    kind, skill = cfg.skill.collect_analyzer, cfg.skill
    if kind == "oracle":
        return make_analyzer("oracle", skill_mode=skill.skill_mode)
    if kind == "self":
        return make_analyzer("self", engine=engine, tokenizer=tokenizer, skill_mode=skill.skill_mode,
                             max_new_tokens=skill.max_analysis_tokens, max_prompt_tokens=cfg.rollout.max_prompt_length,
                             temperature=skill.analysis_temperature)
    ext = skill.external
    if not ext.endpoint or not ext.model:
        raise ValueError("skill.collect_analyzer=external needs skill.external.endpoint and skill.external.model")
    return make_analyzer("external", base_url=ext.endpoint, model=ext.model, api_key_env=ext.api_key_env,
                         timeout_s=ext.timeout_s, max_retries=ext.retries, max_concurrency=ext.concurrency,
                         temperature=ext.temperature, max_tokens=skill.max_analysis_tokens,
                         skill_mode=skill.skill_mode)
