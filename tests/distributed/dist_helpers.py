"""Shared by the distributed tests: run a function on N CPU processes over gloo (torch.multiprocessing), the
tiny models and step samples the tests shard, and a probe of the largest tensor a rank allocates."""

from __future__ import annotations

import os
import socket
import tempfile
import traceback
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from seedfast.context.sample import StepSample
from seedfast.distributed.mesh import end_process_group
from tests.scoring.scoring_helpers import make_config, random_samples


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn, args, finished: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    done = False
    try:
        fn(rank, world, *args)
        done = True
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        end_process_group(done)  # as the CLI ends a command: a barrier first when every rank got there
    Path(finished, str(rank)).touch()  # every check of fn ran, and the group ended


def run_on_ranks(world: int, fn, *args) -> None:
    """fn(rank, world, *args) on `world` processes with a started gloo process group; a failure on any rank fails
    the test (mp.spawn re-raises it). A rank killed by a signal after fn returned and its group ended (gloo's
    threads aborting at interpreter exit, "terminate called without an active exception": seen once in a clean-clone
    run) is not a failure of the test: every check ran. Killed before that, it is."""
    with tempfile.TemporaryDirectory() as finished:
        try:
            mp.spawn(_entry, args=(world, _free_port(), fn, args, finished), nprocs=world, join=True)
        except mp.ProcessExitedException as err:
            if err.signal_name is None or len(os.listdir(finished)) < world:
                raise
            warnings.warn(f"rank {err.error_index} died of {err.signal_name} at exit, after every check ran",
                          RuntimeWarning, stacklevel=2)


def grouped_samples(seed: int, n: int, group_size: int = 3):
    """random_samples with GRPO groups of `group_size` and rewards."""
    samples = random_samples(torch.Generator().manual_seed(seed), n=n)
    return [StepSample(prompt_ids=s.prompt_ids, response_ids=s.response_ids, insertions=s.insertions,
                       teacher_drops=s.teacher_drops, teacher_valid=s.teacher_valid, sample_id=s.sample_id,
                       group_id=i // group_size, reward=float((i * 7) % 5) / 4) for i, s in enumerate(samples)]


__all__ = ["grouped_samples", "make_config", "random_samples", "run_on_ranks"]

