"""The rollout's sampling seed (seeds.sampling_seed, through Trainer._sampling_seed): (run.seed, step) in one
process, and different per data-parallel rank (their tasks differ; the same noise on every rank would correlate their
samples); tensor-parallel peers share a data-parallel rank and so a seed, as the vocabulary-parallel sampler needs."""

from types import SimpleNamespace

from seedfast.config import load_config
from seedfast.seeds import step_seed
from seedfast.train.rl import Trainer


def _seed(dp_rank, step, run_seed=3):
    cfg = load_config(None, [f"run.seed={run_seed}"])
    dp = None if dp_rank is None else SimpleNamespace(rank=dp_rank)
    return Trainer._sampling_seed(SimpleNamespace(cfg=cfg, dp=dp), step)


def test_one_process_and_rank_zero_keep_the_step_seed():
    assert _seed(None, 5) == _seed(0, 5) == step_seed(3, 5)


def test_data_parallel_ranks_draw_differently_and_reproducibly():
    seeds = [_seed(r, 5) for r in range(8)]
    assert len(set(seeds)) == 8 and all(0 <= s < 2**31 - 1 for s in seeds)
    assert seeds == [_seed(r, 5) for r in range(8)]
    assert _seed(1, 5) != _seed(1, 6)
