"""The real-vLLM tier's shared fixtures: the loop tests' policy, and vLLM's CPU back end sized for a small machine."""

from pathlib import Path

import pytest

from seedfast.config import load_config
from tests.vllm_real.vllm_helpers import engine_env


@pytest.fixture(scope="module")
def policy32(overrides, train_games, tmp_path_factory) -> Path:
    """The tests' tiny policy (one short SFT epoch on the games) with 2 heads of 32 instead of 16."""
    from seedfast.sft import run as sft

    out = tmp_path_factory.mktemp("policy32")
    cfg = load_config(None, [*overrides(train_games, out), "model.tiny.hidden=64", "model.tiny.heads=2",
                             "model.tiny.kv_heads=1", "model.tiny.intermediate=128"])
    sft.main(cfg)
    return cfg.run_dir / "sft"


@pytest.fixture
def small_engine():
    """For the files that name it (pytestmark): a small KV cache, no thread pinning (a producer inherits them); the
    engine's size is SMALL_ENGINE's."""
    engine_env()
