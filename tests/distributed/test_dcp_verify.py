"""Sharded (DCP) checkpoints verify themselves too: each rank hashes its own shards into the manifest, and on resume the
ranks split the checking, agree on the verdict and load the same step: a garbled shard of the newest checkpoint is
named and every rank resumes the one before."""

from __future__ import annotations

import json
import warnings

import torch
from torch.distributed.device_mesh import init_device_mesh

from seedfast.distributed.parallelize import apply_fsdp
from seedfast.model.decoder import build_decoder
from seedfast.runtime.checkpoint import resume_latest, save_checkpoint
from seedfast.runtime.optim import adamw
from tests.distributed.dist_helpers import make_config, run_on_ranks


def _sharded(world):
    model = build_decoder(make_config("qwen2"), dtype=torch.float32, seed=8)
    apply_fsdp(model, init_device_mesh("cpu", (world,)))
    opt = adamw(list(model.parameters()), lr=1e-2)
    return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def _garble(shard):
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the hash tells
    shard.write_bytes(bytes(data))


def _save_garble_resume(rank, world, folder):
    model, opt, sched = _sharded(world)
    for step in (1, 2):
        save_checkpoint(folder, step, model, opt, sched, {"bad_steps": 0})
    if rank == 0:
        _garble(folder / "step_2" / "dcp" / "__1_0.distcp")  # rank 1's shard of the newest checkpoint
    torch.distributed.barrier()
    model, opt, sched = _sharded(world)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path, state = resume_latest(folder, model, opt, sched)
    (folder / f"rank{rank}.json").write_text(json.dumps({"path": path.name, "step": state["step"],
                                                         "warned": [str(w.message) for w in caught]}))


def test_a_garbled_shard_is_named_and_every_rank_resumes_the_step_before(tmp_path):
    run_on_ranks(2, _save_garble_resume, tmp_path)
    newest = tmp_path / "step_2"
    files = json.loads((newest / "manifest.json").read_text())["files"]
    assert {"dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp", "rng_rank0.pt", "rng_rank1.pt", "state.pt",
            "trainer_state.json"} <= set(files)
    shard = newest / "dcp" / "__1_0.distcp"
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert rank0["path"] == rank1["path"] == "step_1" and rank0["step"] == rank1["step"] == 1
    assert any(f"{newest} is damaged" in w and f"{shard}: sha256 differs" in w for w in rank0["warned"])
    assert rank1["warned"] == []  # rank 0 alone says it
