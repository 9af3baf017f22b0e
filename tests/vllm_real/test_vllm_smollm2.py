"""A real pretrained model (SmolLM2-135M-Instruct, `seedfast models fetch smollm2-135m`, cached in .cache/models)
rolled out by the REAL vLLM on its CPU back end beside the own sampler: the train-vs-rollout log-prob gap of each
(|log-prob the trainer computes for the sampled token - the one the engine sampled it with|, the RL loop's
rollout/logprob_gap_*), before and after a weight push. The numbers are printed (pytest -s) and bounded. Skipped
without vllm or without the cached model."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")

from seedfast.distributed.weight_push import buckets, hf_named_tensors  # noqa: E402
from seedfast.model import load_hf  # noqa: E402
from seedfast.model.packing import make_cu_seqlens  # noqa: E402
from seedfast.rollout.own_engine import Sampler  # noqa: E402
from seedfast.sampling_params import SamplingParams  # noqa: E402
from tests.vllm_real.vllm_helpers import make_engine  # noqa: E402

MODEL = Path(__file__).resolve().parents[2] / ".cache" / "models" / "smollm2-135m-instruct"
TEXTS = ["You are in a kitchen. There is a fridge and a table. What do you do next?",
         "Go north, take the key, open the chest. Which room holds the treasure?",
         "The cellar is dark. You can see a lantern on the shelf.",
         "Inventory: a rusty key, a map. Exits: east, west."]
NEW_TOKENS = 24


def _trainer_logprobs(policy, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log-probs of `completion` after `prompt` from one forward of the policy (the trainer's recompute)."""
    ids = torch.tensor(prompt + completion)
    with torch.no_grad():
        hidden = policy(ids, make_cu_seqlens([len(ids)], ids.device))
        logits = hidden[len(prompt) - 1 : -1].float() @ policy.lm_head_weight.float().T
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]


def _gap(policy, prompts, gens) -> tuple[float, float]:
    """(mean, max) |trainer log-prob - rollout log-prob| over every generated token."""
    gaps = torch.cat([(_trainer_logprobs(policy, p, g.token_ids) - torch.tensor(g.logprobs)).abs()
                      for p, g in zip(prompts, gens)])
    return float(gaps.mean()), float(gaps.max())


@pytest.fixture(scope="module")
def setup():
    if not (MODEL / "config.json").exists():
        pytest.skip(f"no cached model at {MODEL}: .venv/bin/seedfast models fetch smollm2-135m")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    prompts = [tok.encode(t).ids for t in TEXTS]
    policy = load_hf(MODEL, dtype=torch.float32, attn_backend="sdpa")
    engine = make_engine(MODEL)
    yield policy, engine, prompts
    engine.close()  # now: left to the interpreter's exit, vLLM logs into pytest's closed output streams


def test_smollm2_rollout_gap_through_real_vllm_beside_the_own_engine(setup):
    policy, engine, prompts = setup
    rows = {}
    start = time.perf_counter()
    theirs = engine.generate_full(prompts, SamplingParams(NEW_TOKENS, temperature=1.0), seeds=list(range(len(prompts))))
    rows["vllm"] = _gap(policy, prompts, theirs) + (time.perf_counter() - start,)
    start = time.perf_counter()
    ours = Sampler(policy, seed=0).generate_full(prompts, SamplingParams(NEW_TOKENS, temperature=1.0))
    rows["own"] = _gap(policy, prompts, ours) + (time.perf_counter() - start,)
    # an update, pushed: the gap after it is the engine's on the new weights
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(1 + 0.01 * torch.randn(p.shape, generator=gen))
    stats = engine.push_weights(buckets(hf_named_tensors(policy), 64 << 20))
    theirs = engine.generate_full(prompts, SamplingParams(NEW_TOKENS, temperature=1.0), seeds=list(range(len(prompts))))
    rows["vllm after push"] = _gap(policy, prompts, theirs) + (stats["seconds"],)
    ours = Sampler(policy, seed=0).generate_full(prompts, SamplingParams(NEW_TOKENS, temperature=1.0))
    rows["own after update"] = _gap(policy, prompts, ours) + (0.0,)
    print(f"\nSmolLM2-135M fp32, {len(prompts)} prompts x {NEW_TOKENS} tokens, temperature 1, CPU "
          f"({torch.get_num_threads()} threads): train-vs-rollout log-prob gap")
    for name, (mean, largest, seconds) in rows.items():
        print(f"  {name:18s} mean {mean:.2e}  max {largest:.2e}  ({seconds:.1f} s)")
    for name, (_, largest, _) in rows.items():
        assert largest < 1e-2, (name, rows)  # rounding of fp32 kernels; a stale weight gives ~0.1-1
