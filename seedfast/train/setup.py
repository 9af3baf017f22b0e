"""Building what a run needs from its config: device, policy, reference, tokenizer, optimizer, games, envs."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

from seedfast.config import Config, ConfigError
from seedfast.model import load_hf
from seedfast.model.tokenizer import load_tokenizer
from seedfast.rollout.agent_loop import AgentLoopConfig, Task
from seedfast.rollout.env_slots import LocalEnvSlots, PoolEnvSlots
from seedfast.rollout.prompts import PromptStyle

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def require_one_process(command: str) -> None:
    """Training runs in one process on one device: refuse a launch under torchrun with several processes, which
    would otherwise train N unsynchronized copies."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(f"seedfast {command} runs in one process (one device); run it without torchrun "
                          "(multi-GPU training is not implemented yet)")


def device_of(cfg: Config) -> torch.device:
    if cfg.trainer.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.trainer.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA device is available")
    return torch.device(cfg.trainer.device)


def policy_path(cfg: Config) -> Path:
    """The policy the RL run starts from: trainer.init_from, else this run's SFT output, else model.path."""
    for candidate in (cfg.trainer.init_from, str(Path(cfg.run_dir) / "sft"), cfg.model.path):
        if candidate and (Path(candidate) / "config.json").is_file():
            return Path(candidate)
    raise ConfigError(
        f"no policy to start from: trainer.init_from={cfg.trainer.init_from!r}, "
        f"{Path(cfg.run_dir) / 'sft'} and model.path={cfg.model.path!r} hold no config.json "
        "(run `seedfast sft` first, or set model.path)"
    )


def load_policy(cfg: Config, path: Path, device: torch.device, trainable: bool = True) -> torch.nn.Module:
    model = load_hf(path, dtype=DTYPES[cfg.model.dtype], device=device)
    model.attn_backend = cfg.model.attn_backend
    model.train(trainable)
    for p in model.parameters():
        p.requires_grad_(trainable)
    return model


def load_run_tokenizer(cfg: Config, path: Path) -> Any:
    for candidate in (cfg.model.tokenizer, path):
        if candidate and Path(candidate).is_dir():
            return load_tokenizer(candidate)
    raise ConfigError(f"model.tokenizer: no tokenizer folder found (tried {cfg.model.tokenizer!r} and {path})")


def make_optimizer(cfg: Config, model: torch.nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    o = cfg.optim
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=o.lr,
                                  weight_decay=o.weight_decay, betas=tuple(o.betas), eps=o.eps)
    total = max(cfg.trainer.steps, 1)

    def factor(step: int) -> float:
        if step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "cosine":
            progress = (step - o.warmup_steps) / max(total - o.warmup_steps, 1)
            return o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def load_tasks(cfg: Config, split: str) -> list[Task]:
    if cfg.env.kind == "alfworld":
        from seedfast.envs.alfworld import list_alfworld_games  # a clear error without alfworld and its data

        files = list_alfworld_games("train" if split == "train" else "eval_out_of_distribution", cfg.env.games_dir)
        limit = cfg.env.n_train if split == "train" else cfg.env.n_eval
        return [Task(game_id=str(Path(f).parent.parent.name), spec=f) for f in files[:limit]]
    from seedfast.envs.textworld_games import load_manifest

    try:
        records = load_manifest(cfg.env.games_dir, split=split, game_type=cfg.env.game_type,
                                levels=cfg.env.levels)
    except FileNotFoundError as err:
        raise ConfigError(f"env.games_dir: {err} (`seedfast envs make` generates games)") from err
    if not records:
        raise ConfigError(f"env.games_dir={cfg.env.games_dir!r} has no {split} games of type "
                          f"{cfg.env.game_type} at levels {cfg.env.levels}")
    limit = cfg.env.n_train if split == "train" else cfg.env.n_eval
    if limit is not None:  # n_train / n_eval count games per level
        per_level: dict[int, int] = {}
        kept = []
        for r in records:
            if per_level.get(r.level, 0) < limit:
                per_level[r.level] = per_level.get(r.level, 0) + 1
                kept.append(r)
        records = kept
    return [Task.from_record(r) for r in records]


def make_env_slots(cfg: Config, n_slots: int) -> Any:
    if cfg.env.kind == "alfworld":
        from seedfast.envs.alfworld import AlfWorldEnv as factory
    else:
        from seedfast.envs.textworld_env import TextWorldEnv as factory
    if cfg.env.isolation == "inline":
        return LocalEnvSlots(factory, n_slots)
    from seedfast.envs.workers import EnvPool

    return PoolEnvSlots(EnvPool(n_slots, env_factory=factory, step_timeout=cfg.env.step_timeout_s))


def agent_config(cfg: Config, *, n: int, temperature: float) -> AgentLoopConfig:
    return AgentLoopConfig(n=n, max_steps=cfg.env.max_steps, max_new_tokens=cfg.rollout.max_response_tokens,
                           temperature=temperature, top_p=cfg.rollout.top_p,
                           invalid_penalty=cfg.env.invalid_penalty,
                           max_prompt_tokens=cfg.rollout.max_prompt_length,
                           style=PromptStyle(history_k=cfg.env.history_k))
