"""`seedfast train CONFIG [--resume auto|PATH] [--profile-steps A:B]`: the RL loop of train/rl.py (Trainer),
one process on one device, or sharded over torchrun's processes (dist.strategy=fsdp), from the policy
runtime/setup.py's policy_path chooses. `--resume` and `--profile-steps` are config keys (trainer.resume,
trainer.profile_steps): the CLI hands them over in cfg, the one channel."""

from __future__ import annotations

from seedfast.config import Config, ConfigError
from seedfast.runtime.setup import start_processes
from seedfast.train.rl import Trainer


def main(cfg: Config) -> int:
    if cfg.trainer.steps < 1:
        raise ConfigError("trainer.steps must be >= 1")
    env = start_processes(cfg, "train")  # one process, or a sharded run under torchrun (docs/scaling.md)
    if env.is_main:
        cfg.save()
    trainer = Trainer(cfg)
    try:
        trainer.run()
    finally:
        trainer.close()
    return 0
