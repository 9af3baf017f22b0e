"""Two asynchronous runs with the same seed write the same metrics, bit for bit, as synchronous runs do
(docs/architecture.md, 'Asynchronous rollouts'): the trainer and the producer split the intra-op threads, so that no
core runs two compute threads (oversubscribed, the trainer's float results varied at ~1e-6 from run to run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seedfast import cli
from seedfast.train.async_rollout import ranks_beside_producer, split_threads

VOLATILE = ("time/", "throughput/", "memory/", "async/")


def _rows(out: Path) -> list[dict]:
    lines = [json.loads(line) for line in (out / "t" / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in lines if "step" in r]


def test_the_threads_are_split_without_oversubscribing():
    assert split_threads(1) == (1, 1)
    assert split_threads(2) == (1, 1)
    assert split_threads(3) == (2, 1)
    assert split_threads(16) == (8, 8)
    # every rank on the producer's node gives it an equal part: 3 ranks x 4 threads = 12 cores, 4 sharers of 3
    assert split_threads(4, trainer_ranks=3) == (3, 3)
    assert split_threads(8, trainer_ranks=2) == (5, 5)  # 16 cores: 5 + 5 + 5 (one left idle, none oversubscribed)
    assert split_threads(1, trainer_ranks=4) == (1, 1)  # torchrun's one thread a rank: at least one each


def test_the_ranks_beside_the_producer_are_its_nodes():
    assert ranks_beside_producer({}, world=1) == 1  # one process
    assert ranks_beside_producer({}, world=2) == 2  # a group started without torchrun: one node
    assert ranks_beside_producer({"GROUP_RANK": "0", "LOCAL_WORLD_SIZE": "4"}, world=8) == 4
    assert ranks_beside_producer({"GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, world=8) == 0  # another node


@pytest.mark.parametrize("mode", ["token_tis", "none"])
def test_two_async_runs_with_one_seed_are_identical(overrides, train_games, tiny_policy, tmp_path, mode):
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the two-core machine's default: split into one thread each
    try:
        rows = []
        for name in ("a", "b"):
            out = tmp_path / name
            assert cli.main(["train", *overrides(train_games, out), "algorithm=grpo",
                             f"trainer.init_from={tiny_policy}", "trainer.steps=4", "rollout.max_staleness=1",
                             f"rollout.correction.mode={mode}"]) == 0
            assert torch.get_num_threads() == 2  # the trainer's threads come back when the run ends
            rows.append(_rows(out))
    finally:
        torch.set_num_threads(before)
    assert [r["step"] for r in rows[0]] == [0, 1, 2, 3]
    assert rows[0] == rows[1]
