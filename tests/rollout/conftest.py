"""Real TextWorld games, a tokenizer trained on their text and a tiny random-init decoder, made once."""

import pytest
import torch

from seedfast.envs.textworld_env import TextWorldEnv
from seedfast.envs.textworld_games import make_games
from seedfast.model import DecoderConfig, build_decoder
from seedfast.model.tokenizer import train_tokenizer
from seedfast.rollout.prompts import DEFAULT_INSTRUCTIONS, DEFAULT_SYSTEM, UNPARSABLE_FEEDBACK


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """tests/conftest.py one_torch_thread, for every test here."""


@pytest.fixture(scope="session")
def games(tmp_path_factory, request):
    """Two tiny treasure_hunter games (walkthroughs of 1 and 2 steps); cached across runs when pytest can."""
    cache = getattr(request.config, "cache", None)  # absent under `-p no:cacheprovider`
    folder = cache.mkdir("seedfast-rollout-games") if cache is not None else tmp_path_factory.mktemp("games")
    return make_games(folder, "treasure_hunter", [1, 3], n_train=1, n_eval=0, seed=0, workers=2)


def game_text(records):
    texts = [DEFAULT_SYSTEM, DEFAULT_INSTRUCTIONS, UNPARSABLE_FEEDBACK]
    for record in records:
        env = TextWorldEnv(record.path)
        try:
            obs = env.reset()
            texts += [obs.task, obs.text, ", ".join(obs.admissible_actions)]
            for action in record.walkthrough:
                obs, *_ = env.step(action)
                texts += [obs.text, ", ".join(obs.admissible_actions), f"<action>{action}</action>"]
        finally:
            env.close()
    return texts * 4


@pytest.fixture(scope="session")
def tokenizer(games):
    return train_tokenizer(game_text(games), vocab_size=700)


@pytest.fixture(scope="session")
def policy(tokenizer):
    cfg = DecoderConfig(model_type="qwen3", vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return build_decoder(cfg, dtype=torch.float32, attn_backend="sdpa", seed=0)
