"""`seedfast sft` over 2 CPU processes (gloo, FSDP2) equals one process: a few SFT optimizer steps and copy-task
warm-up steps give the one-process losses and weights (fp32, 1e-5); the ranks start from the same tokenizer,
examples and weights when the model is built from scratch; and `torchrun --nproc-per-node 2 -m seedfast sft`
writes an sft/ folder transformers loads, rank 0 alone writing the metrics (docs/scaling.md)."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from seedfast.config import SFTConfig, load_config
from seedfast.model.decoder import build_decoder
from seedfast.sft.copy_warmup import copy_warmup
from seedfast.sft.examples import SFTExample
from seedfast.sft.loop import train_sft
from tests.distributed.dist_helpers import make_config, run_on_ranks

ROOT = Path(__file__).resolve().parents[2]


def _examples(n: int, vocab: int, seed: int = 1) -> list[SFTExample]:
    """Random examples of mixed kinds and lengths, the loss on the answer and (at weight 0.5) some prompts."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(6, 40)
        start = rng.randint(2, length - 2)
        prompt_loss = i % 3 == 0
        mask = [prompt_loss and t > 0 for t in range(start)] + [True] * (length - start)
        out.append(SFTExample([rng.randrange(vocab) for _ in range(length)], mask, ("bc", "skill", "jsonl")[i % 3],
                              f"ex {i}", answer_start=start))
    return out


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _sharding(world: int):
    from seedfast.app.sft import sft_sharding

    # fp32 compute, as the one-process reference (bf16 over fp32 masters: test_fsdp_mixed_precision.py)
    cfg = load_config(None, ["dist.strategy=fsdp", "trainer.device=cpu", "model.dtype=fp32"])
    return sft_sharding(cfg, torch.device("cpu"))


def _equal_steps_worker(rank: int, world: int) -> None:
    model = build_decoder(make_config("qwen2"), dtype=torch.float32, seed=3)  # tied embeddings, q/k/v bias
    examples = _examples(13, model.config.vocab_size)
    # at most 96 tokens a step (several steps a pass, split unevenly by tokens over the ranks); prompt rows at
    # weight 0.5: the global weight sum, not the token count, is the denominator
    cfg = SFTConfig(epochs=2, lr=3e-3, batch_tokens=96, weight_decay=0.01, warmup_steps=1, prompt_loss_weight=0.5)
    ref = copy.deepcopy(model)
    ref_logs: list[dict] = []
    ref_warm = copy_warmup(ref, list(range(5, 60)), 3, lr=1e-2, batch_tokens=120, seed=2)
    ref_stats = train_sft(ref, examples, cfg, seed=4, log_fn=ref_logs.append, grad_clip=0.05)

    sharding = _sharding(world)
    model = sharding.shard(model)
    logs: list[dict] = []
    warm = copy_warmup(model, list(range(5, 60)), 3, lr=1e-2, batch_tokens=120, seed=2, sharding=sharding)
    stats = train_sft(model, examples, cfg, seed=4, log_fn=logs.append, grad_clip=0.05, sharding=sharding)

    assert warm == pytest.approx(ref_warm, rel=1e-5)
    assert stats.steps == ref_stats.steps >= 6 and stats.tokens == ref_stats.tokens
    assert stats.loss_tokens == ref_stats.loss_tokens
    for mine, theirs in zip(logs, ref_logs, strict=True):
        assert mine.keys() == theirs.keys()  # the per-kind losses of the kinds in the step, on every rank
        for k in mine.keys() - {"elapsed_s", "tokens_per_s"}:
            assert mine[k] == pytest.approx(theirs[k], rel=1e-5, abs=1e-7), (mine["step"], k)
    assert any(r["grad_norm"] > 0.05 for r in ref_logs)  # clipping was active: the global norm matters
    for (n, p), (rn, rp) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        assert n == rn
        # 3e-5: fp32 summation order (per-rank partial norms and losses) moves a weight by ~1e-5 after Adam's first
        # steps at eps 1e-8, where g / (|g| + eps) amplifies differences on near-zero gradients (one weight of 4096
        # moved 2.4e-5 once the last layer summed over the loss rows alone: model/decoder.py keep_last)
        torch.testing.assert_close(_full(p.detach()), rp.detach(), rtol=1e-5, atol=3e-5, msg=n)
    untrained = build_decoder(make_config("qwen2"), dtype=torch.float32, seed=3)
    assert not torch.allclose(ref.lm_head_weight, untrained.lm_head_weight)  # the steps moved the weights


def test_two_rank_sft_steps_and_copy_warmup_equal_one_process():
    run_on_ranks(2, _equal_steps_worker)


def test_a_step_with_fewer_examples_than_ranks_runs_a_zero_weight_example():
    """Two examples, one longer than the budget's half: some steps hold one example, so one rank has none and
    runs the padding example (same collectives); the result still equals one process."""
    run_on_ranks(2, _padding_worker)


def _padding_worker(rank: int, world: int) -> None:
    model = build_decoder(make_config("llama"), dtype=torch.float32, seed=5)
    examples = _examples(3, model.config.vocab_size, seed=7)
    cfg = SFTConfig(epochs=2, lr=3e-3, batch_tokens=40, weight_decay=0.0)
    ref = copy.deepcopy(model)
    ref_stats = train_sft(ref, examples, cfg, seed=0)
    sharding = _sharding(world)
    model = sharding.shard(model)
    stats = train_sft(model, examples, cfg, seed=0, sharding=sharding)
    assert stats.last_loss == pytest.approx(ref_stats.last_loss, rel=1e-5)
    for p, rp in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(_full(p.detach()), rp.detach(), rtol=1e-5, atol=1e-5)


def _start_worker(rank: int, world: int, out: str, overrides: list[str]) -> None:
    from seedfast.sft.run import sft_start

    cfg = load_config(None, [*overrides, "dist.strategy=fsdp"])
    start = sft_start(cfg, torch.device("cpu"), _sharding(world))
    state = {k: v.clone() for k, v in start.model.state_dict().items()}
    mine = (sorted(start.tokenizer.get_vocab().items()), [(e.input_ids, e.loss_mask) for e in start.examples],
            start.counts)
    every: list = [None] * world
    dist.all_gather_object(every, (mine, state))
    (vocab, examples, counts), first = every[0]
    assert len(vocab) > 100 and examples
    for (v, e, c), s in every[1:]:
        assert v == vocab and e == examples and c == counts
        assert s.keys() == first.keys()
        for k in s:
            assert torch.equal(s[k], first[k]), k
    if rank == 0:  # rank 0 alone trained and wrote the tokenizer
        assert (Path(out) / "t" / "tokenizer" / "tokenizer_config.json").is_file()


def test_ranks_start_from_the_same_tokenizer_examples_and_weights(overrides, train_games, tmp_path):
    run_on_ranks(2, _start_worker, str(tmp_path), overrides(train_games, tmp_path))


def test_torchrun_two_ranks_sft_end_to_end(overrides, train_games, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "seedfast",
           "sft", "configs/demo_cpu.yaml", *overrides(train_games, tmp_path), "dist.strategy=fsdp",
           "sft.copy_warmup_steps=2", "sft.renamed_copies=1", "sft.epochs=1", "sft.batch_tokens=2048"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    run = tmp_path / "t"
    rows = [json.loads(line) for line in (run / "sft_metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "step" in r and "event" not in r]
    assert steps == list(range(1, len(steps) + 1)) and steps  # one writer: two would give each step twice
    assert [r["event"] for r in rows if "event" in r] == ["data", "copy_warmup", "done"]
    assert p.stdout.count("sft: ") == 1  # rank 0 alone prints
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(run / "sft")
    assert torch.isfinite(next(hf.parameters())).all() and (run / "sft" / "tokenizer_config.json").is_file()
    assert not [f for f in run.iterdir() if f.name.startswith(".sft")]  # no temporary folder left behind
