"""Where rollouts run (runtime/placement.py): each placement a run cannot keep is refused by its key before anything
is built, and a producer started under `producer_environment` sees exactly its GPUs, in the node's numbering."""

from __future__ import annotations

import multiprocessing
import os

import pytest
import torch

from seedfast.config import ConfigError, load_config
from seedfast.runtime.placement import VISIBLE, check_placement, producer_device, producer_environment

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")


def _cfg(*overrides: str):
    return load_config(None, list(overrides))


def test_a_disaggregated_placement_that_holds_passes():
    check_placement(_cfg("rollout.max_staleness=1", "rollout.devices=4"), CUDA, local_world=4, gpu_count=8)
    check_placement(_cfg("rollout.max_staleness=2", "rollout.devices=6-7", "rollout.engine=vllm",
                         "rollout.tensor_parallel=2", "model.path=/some/hf"), CUDA, local_world=6, gpu_count=8)
    # colocated on the CPU (the asynchronous loop of today), and every synchronous run without devices
    check_placement(_cfg("rollout.max_staleness=1"), CPU, local_world=1, gpu_count=0)
    check_placement(_cfg(), CUDA, local_world=8, gpu_count=8)


@pytest.mark.parametrize("overrides,device,local_world,gpus,match", [
    (["rollout.max_staleness=1"], CUDA, 1, 1, r"rollout.max_staleness=1 on cuda:0: the rollout producer would share"),
    (["rollout.devices=1"], CUDA, 1, 2, r"rollout.devices=\[1\]: GPUs of their own are for the rollout producer"),
    (["rollout.devices=1", "rollout.max_staleness=1"], CPU, 1, 2, r"with the trainer on cpu"),
    (["rollout.devices=2-3", "rollout.max_staleness=1"], CUDA, 1, 4, r"2 GPU\(s\) for the own engine's one"),
    (["rollout.devices=3", "rollout.max_staleness=1", "rollout.engine=vllm", "rollout.tensor_parallel=2",
      "model.path=/some/hf"], CUDA, 1, 4, r"1 GPU\(s\) for rollout.tensor_parallel=2 \(vLLM\)"),
    (["rollout.devices=3", "rollout.max_staleness=1"], CUDA, 4, 8, r"GPU\(s\) \[3\] are the trainer's"),
    (["rollout.devices=5", "rollout.max_staleness=1"], CUDA, 2, 4, r"this node has 4 GPU\(s\), no GPU \[5\]"),
    (["rollout.devices=1,1", "rollout.max_staleness=1", "rollout.engine=vllm", "rollout.tensor_parallel=2",
      "model.path=/some/hf"], CUDA, 1, 4, r"distinct GPU indices"),
])
def test_a_placement_the_run_cannot_keep_is_refused_by_its_key(overrides, device, local_world, gpus, match):
    with pytest.raises(ConfigError, match=match):
        check_placement(_cfg(*overrides), device, local_world=local_world, gpu_count=gpus)


def test_a_trainer_refuses_a_placement_before_it_builds_anything(monkeypatch, tmp_path):
    """The check runs first in Trainer.__init__: no policy loaded, no engine or environment started for a run that
    cannot go (a load here would fail anyway: the model folder does not exist)."""
    from seedfast.train import rl

    def built(*_args, **_kwargs):
        raise AssertionError("the policy was loaded before the placement was checked")

    monkeypatch.setattr(rl, "load_trainable_policy", built)
    cfg = _cfg("rollout.devices=1", "trainer.device=cpu", f"run.out_dir={tmp_path}", f"model.path={tmp_path / 'no'}")
    with pytest.raises(ConfigError, match=r"rollout.devices=\[1\]: GPUs of their own are for the rollout producer"):
        rl.Trainer(cfg)


def test_off_the_node_only_the_placement_itself_is_checked():
    cfg = _cfg("rollout.devices=0", "rollout.max_staleness=1")  # GPU 0 is a trainer rank's on any node
    check_placement(cfg, CUDA, on_node=False)
    with pytest.raises(ConfigError, match="the trainer's"):
        check_placement(cfg, CUDA, local_world=1, gpu_count=2)


def test_the_producer_runs_on_the_first_of_its_own_gpus_or_on_the_trainers_device():
    assert producer_device(_cfg("rollout.devices=6-7", "rollout.max_staleness=1"), CUDA) == torch.device("cuda", 0)
    assert producer_device(_cfg("rollout.max_staleness=1"), CPU) == CPU


def _report_visible(queue) -> None:
    queue.put((os.environ.get(VISIBLE), sorted(k for k in os.environ if k in ("RANK", "LOCAL_RANK", "WORLD_SIZE",
                                                                             "MASTER_PORT", "TORCHELASTIC_RUN_ID"))))


def _child_sees(cfg) -> str | None:
    ctx = multiprocessing.get_context("spawn")  # as RolloutProducer starts the producer
    queue = ctx.Queue()
    with producer_environment(cfg):
        process = ctx.Process(target=_report_visible, args=(queue,))
        process.start()
    seen, rank_variables = queue.get(timeout=60)
    process.join(timeout=60)
    assert rank_variables == []  # the producer is no torchrun rank
    return seen


def test_a_spawned_producer_sees_its_gpus_and_the_trainers_view_is_restored(monkeypatch):
    monkeypatch.delenv(VISIBLE, raising=False)
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "29500"),
                       ("TORCHELASTIC_RUN_ID", "x")):  # as under torchrun
        monkeypatch.setenv(key, value)
    assert _child_sees(_cfg("rollout.devices=6-7", "rollout.max_staleness=1")) == "6,7"
    assert VISIBLE not in os.environ
    # a trainer that itself sees a subset: the indices are its view's, mapped to the node's for the child
    monkeypatch.setenv(VISIBLE, "2,3,5,9")
    assert _child_sees(_cfg("rollout.devices=2-3", "rollout.max_staleness=1")) == "5,9"
    assert os.environ[VISIBLE] == "2,3,5,9"
    # no devices: the child inherits the trainer's view untouched
    assert _child_sees(_cfg("rollout.max_staleness=1")) == "2,3,5,9"
    assert os.environ["RANK"] == "0" and os.environ["TORCHELASTIC_RUN_ID"] == "x"  # the trainer's, restored
