"""The layout of a run folder (<run.out_dir>/<run.name>, `Config.run_dir`): every file and folder a command writes
there or reads back, named once. The commands, SFT and the trainer spell no run-folder name themselves.

    config.yaml          the resolved config (Config.save; a folder given to load_config stands for it)
    errors.log           the traceback of each failed command (its one line on stderr says which kind: app/failures.py)
    collect/             `seedfast collect`'s output, unless collect.out names another folder (`collect_dir`)
    tokenizer/           a tiny model's BPE tokenizer, trained by `seedfast sft`
    sft/                 `seedfast sft`'s policy: an HF folder with its tokenizer
    sft_metrics.jsonl    SFT's metrics, its TensorBoard events in tb/sft
    ckpt/                the RL checkpoints (runtime/checkpoint.py: step_<n>/)
    metrics.jsonl        RL's metrics, its TensorBoard events in tb/
    skills.jsonl         the privileged text the teacher read, a few trajectories per RL step
    hf/                  the RL run's trained policy: an HF folder with its tokenizer (LoRA: the adapters merged)
    adapter/             a LoRA run's adapters alone, a PEFT folder (model/peft_io.py)
    eval_<split>.json    `seedfast eval`'s metrics on a split
    plan_world<N>_tp<T>.json   `seedfast plan`'s memory plan
    <algorithm>/, control/     `make demo`'s RL runs, each a run folder of its own (`sub`),
    report.md, report.png, demo_summary.json   and the demo's report
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from seedfast.config import CONFIG_FILE, Config


@dataclass(frozen=True)
class RunPaths:
    """The paths of the run folder `root`."""

    root: Path

    @classmethod
    def of(cls, cfg: Config) -> RunPaths:
        """The run folder of `cfg` (run.out_dir / run.name)."""
        return cls(Path(cfg.run_dir))

    def sub(self, name: str) -> RunPaths:
        """A run folder inside this one (the demo's per-algorithm RL runs)."""
        return RunPaths(self.root / name)

    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def error_log(self) -> Path:
        return self.root / "errors.log"

    @property
    def collect(self) -> Path:
        """The default collect.out (`collect_dir` applies the key)."""
        return self.root / "collect"

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer"

    @property
    def sft(self) -> Path:
        return self.root / "sft"

    @property
    def sft_metrics(self) -> Path:
        return self.root / "sft_metrics.jsonl"

    @property
    def sft_tb(self) -> Path:
        return self.tb / "sft"

    @property
    def ckpt(self) -> Path:
        return self.root / "ckpt"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def skills(self) -> Path:
        return self.root / "skills.jsonl"

    @property
    def tb(self) -> Path:
        return self.root / "tb"

    @property
    def hf(self) -> Path:
        return self.root / "hf"

    @property
    def adapter(self) -> Path:
        return self.root / "adapter"

    def eval(self, split: str) -> Path:
        return self.root / f"eval_{split}.json"

    def plan(self, world: int, tp: int) -> Path:
        return self.root / f"plan_world{world}_tp{tp}.json"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    @property
    def report_png(self) -> Path:
        return self.root / "report.png"

    @property
    def demo_summary(self) -> Path:
        return self.root / "demo_summary.json"


def collect_dir(cfg: Config) -> Path:
    """Where `seedfast collect` writes and `seedfast sft` looks for its pairs: collect.out, else <run_dir>/collect."""
    return Path(cfg.collect.out) if cfg.collect.out else RunPaths.of(cfg).collect
