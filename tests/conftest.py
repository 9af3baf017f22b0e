"""Suite-wide settings and fixtures. Under CI (CI=true) property tests draw the same examples on every run, so a
red CI is a regression, never a new random draw; locally they keep exploring."""

import os

import pytest
import torch
from hypothesis import settings

from seedfast.config import load_config

settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")


@pytest.fixture
def one_torch_thread():
    """One intra-op thread for the test, restored after it. Tiny matmuls gain nothing from threads, and under
    `pytest -n 2` on 2 cores a second thread per worker only spins against the other worker (measured: 4x the CPU
    time of the rollout tests); the distributed tests' ranks run one thread each (distributed/dist_helpers.py), so a
    one-process reference with one thread runs the same kernels."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# A tiny real setup for the SFT, RL and app tests: generated TextWorld games and a from-scratch policy saved as
# HF. The fixtures skip where textworld is not installed.


def tiny_overrides(games_dir, out_dir) -> list[str]:
    return [
        f"env.games_dir={games_dir}", "env.game_type=treasure_hunter", "env.levels=[3]", "env.n_train=2",
        "env.n_eval=1", "env.max_steps=3", "env.isolation=inline", "env.history_k=1",
        f"run.out_dir={out_dir}", "run.name=t", "model.dtype=fp32", "model.attn_backend=sdpa",
        "model.tiny.hidden=32", "model.tiny.layers=2", "model.tiny.heads=2", "model.tiny.kv_heads=1",
        "model.tiny.intermediate=64", "model.tiny.bpe_vocab_size=400", "model.tiny.max_seq_len=2048",
        "rollout.n=2", "rollout.tasks_per_batch=2", "rollout.max_response_tokens=6",
        "rollout.max_prompt_length=1024", "skill.max_analysis_tokens=8", "skill.analyzer=oracle",
        "trainer.steps=2", "trainer.eval_every=0", "trainer.checkpoint_every=1", "trainer.device=cpu",
        "trainer.micro_batch_tokens=4096", "optim.lr=1e-3", "log.tensorboard=false", "log.progress=false",
        "grsd.judge=oracle", "grsd.max_reflection_tokens=8", "grsd.max_guidance_tokens=8",
        "sft.behaviour_cloning=true", "sft.epochs=1", "sft.batch_tokens=4096", "sft.lr=1e-3",
    ]


@pytest.fixture(scope="session")
def shared_games(tmp_path_factory):
    """shared_games(name, levels, n_train, n_eval): TextWorld games generated once for the whole run, in a folder
    every xdist worker shares (make_games keeps what is there)."""
    pytest.importorskip("textworld")
    from seedfast.envs.textworld_games import make_games

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent

    def make(name: str, levels: list[int], n_train: int, n_eval: int):
        out = base / name
        make_games(out, "treasure_hunter", levels, n_train, n_eval, seed=0, workers=1)
        return out

    return make


@pytest.fixture(scope="session")
def train_games(shared_games):
    return shared_games("seedfast_train_games", [3], 2, 1)


@pytest.fixture(scope="session")
def tiny_policy(train_games, tmp_path_factory):
    """An SFT'd (one short epoch) tiny policy, saved as an HF folder with its tokenizer."""
    from seedfast.sft import run as sft

    out = tmp_path_factory.mktemp("policy")
    cfg = load_config(None, tiny_overrides(train_games, out))
    sft.main(cfg)
    return cfg.run_dir / "sft"


@pytest.fixture(scope="session")
def overrides():
    """tiny_overrides as a fixture, for test modules (conftest is not importable by name)."""
    return tiny_overrides
