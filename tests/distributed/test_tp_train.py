"""What `seedfast train` runs under tensor parallel (dp_shard=1 x tp=2, 2 CPU processes over gloo, the model sharded
by parallelize_decoder as runtime/setup.py does): the scoring pass (ℓold, entropy, ℓskill with the teacher rows),
ℓref, and one SEED update with the teacher on the update forward's prefix KV equal one process; the own sampler
draws from the vocabulary shards (Gumbel-max) exactly what the whole head gives with the same noise, greedy decoding
equals the one-process sampler token for token, and no rank forms the [B, V] logits (docs/scaling.md)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from seedfast.distributed import vocab_head
from seedfast.distributed.data import DataParallel
from seedfast.distributed.mesh import MESH_DIMS
from seedfast.distributed.parallelize import parallelize_decoder
from seedfast.distributed.vocab_head import gumbel_noise, tp_sample_next
from seedfast.model.decoder import build_decoder
from seedfast.rollout.own_engine import Sampler
from seedfast.sampling_params import SamplingParams
from seedfast.scoring import score, score_reference
from tests.distributed.dist_helpers import grouped_samples, make_config, run_on_ranks
from tests.distributed.test_fsdp_update import CASES, _full, _update
from tests.largest_tensor import LargestTensor

VOCAB = 203  # odd: shards of 102 and 101 rows
TOL = dict(rtol=1e-5, atol=1e-5)


def _models():
    ref = build_decoder(make_config("qwen2", vocab_size=VOCAB), dtype=torch.float32, seed=4)
    model = copy.deepcopy(ref)
    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=MESH_DIMS)
    parallelize_decoder(model, mesh)  # TP, then FSDP2 over the 1-rank data-parallel dimension: as train does
    return ref, model, mesh


def _full_head_gumbel(hidden, weight, temperature, top_p, generator):
    """The reference draw on the whole head: argmax of logits / T + the same Gumbel noise, log-softmax."""
    z = (hidden @ weight.T).float()
    z = z / temperature if temperature > 0 else z
    score_ = z + gumbel_noise(z.shape[0], z.shape[1], 0, z.shape[1], generator, z.device) if temperature > 0 else z
    tok = score_.argmax(dim=1)
    return tok, torch.log_softmax(z, dim=1).gather(1, tok[:, None]).squeeze(1)


def _sampler_worker(rank, world):
    torch.manual_seed(0)
    ref, model, _ = _models()
    prompts = [[5, 9, 200, 3], [7, 1], [5, 9, 200, 3], [100, 101, 102, 103, 104, 105]]
    from seedfast.distributed.parallelize import unsharded

    with unsharded(model):
        # sampling at T = 1.3: the shards' draw is the whole head's draw with the same noise
        tp = Sampler(model, seed=11).generate_full(prompts, SamplingParams(9, temperature=1.3))
        ref.head_ops = SimpleNamespace(sample_next=_full_head_gumbel)
        full = Sampler(ref, seed=11).generate_full(prompts, SamplingParams(9, temperature=1.3))
        del ref.head_ops
        assert [g.token_ids for g in tp] == [g.token_ids for g in full]
        assert len({tuple(g.token_ids) for g in tp}) > 1  # not a constant output
        for a, b in zip(tp, full):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), **TOL)
        # greedy: the one-process sampler itself (sample_next on the whole [B, V] logits), token for token
        tp = Sampler(model, seed=0).generate_full(prompts, SamplingParams(7, temperature=0.0))
        plain = Sampler(ref, seed=0).generate_full(prompts, SamplingParams(7, temperature=0.0))
        assert [g.token_ids for g in tp] == [g.token_ids for g in plain]
        for a, b in zip(tp, plain):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), **TOL)

        # no rank forms [B, V]: the largest tensor of a draw is this rank's [B, V/2] logits (the noise is drawn in
        # tiles; here tiles of 64 tokens, smaller than a shard, as NOISE_TILE=8192 is against a real vocabulary)
        vocab_head.NOISE_TILE = 64
        hidden = torch.randn(128, ref.config.hidden_size, generator=torch.Generator().manual_seed(2))
        probe = LargestTensor()
        with probe:
            tp_sample_next(hidden, model.lm_head_weight, 1.0, 1.0, torch.Generator().manual_seed(3))
        assert 0 < probe.numel <= 128 * ((VOCAB + 1) // 2) < 128 * VOCAB, probe.numel  # > the weight shard
        with pytest.raises(ValueError, match="rollout.top_p"):
            tp_sample_next(hidden, model.lm_head_weight, 1.0, 0.9, torch.Generator())


def test_tp2_sampler_draws_what_the_whole_head_draws():
    run_on_ranks(2, _sampler_worker)


def _scoring_worker(rank, world):
    torch.manual_seed(0)
    ref, model, mesh = _models()
    samples = grouped_samples(5, 8)
    assert any(s.has_teacher for s in samples) and not all(s.has_teacher for s in samples)
    from seedfast.distributed.parallelize import unsharded

    with unsharded(model):
        got = score(model, samples, with_entropy=True, token_budget=64, temperature=1.1)
        got_ref = score_reference(model, samples, token_budget=64)
    want = score(ref, samples, with_entropy=True, token_budget=64, temperature=1.1)
    want_ref = score_reference(ref, samples, token_budget=64)
    for a, b in ((got.logprob, want.logprob), (got.entropy, want.entropy), (got.teacher_logprob, want.teacher_logprob),
                 (got_ref.logprob, want_ref.logprob)):
        torch.testing.assert_close(a, b, **TOL)
    assert torch.equal(got.teacher_mask, want.teacher_mask) and bool(want.teacher_mask.any())

    # one SEED update, ℓskill from the teacher branches on the update forward's prefix KV (scoring/
    # prefix_kv_teacher.py through the vocabulary-parallel head)
    case = CASES["seed"]
    start = copy.deepcopy(ref)
    ref_loss, ref_metrics, ref_norm, _ = _update(ref, samples, case)
    loss, metrics, norm, _ = _update(model, samples, case, dp=DataParallel.from_mesh(mesh))
    assert ref_metrics["opd_term"] != 0.0
    assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-7)
    assert norm == pytest.approx(ref_norm, rel=1e-5)
    for k, v in ref_metrics.items():  # the teacher gaps are differences of log-probs of ~5: fp32 rounding ~1e-6
        assert metrics[k] == pytest.approx(v, rel=1e-5, abs=1e-6), (k, metrics[k], v)
    for (n, p), (_, rp) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(_full(p.detach()), rp.detach(), **TOL, msg=n)
    assert not torch.allclose(ref.lm_head_weight, start.lm_head_weight)


def test_tp2_scoring_and_seed_update_equal_one_process():
    run_on_ranks(2, _scoring_worker)


def test_gumbel_max_with_the_tiled_noise_samples_the_softmax():
    """The noise is Gumbel(0, 1) per token: argmax(z + g) over 40,000 rows follows softmax(z) (3 sigma)."""
    z = torch.tensor([1.0, 0.0, -1.0, 2.0, 0.5])
    rows = 40_000
    g = gumbel_noise(rows, 5, 0, 5, torch.Generator().manual_seed(0), torch.device("cpu"))
    freq = torch.bincount((z + g).argmax(dim=1), minlength=5).float() / rows
    p = torch.softmax(z, 0)
    assert torch.all((freq - p).abs() <= 3 * (p * (1 - p) / rows).sqrt())
    # the slice of a range is the same noise as the whole vocabulary's, whatever the range
    whole = gumbel_noise(3, 20_000, 0, 20_000, torch.Generator().manual_seed(1), torch.device("cpu"))
    part = gumbel_noise(3, 20_000, 8000, 12_345, torch.Generator().manual_seed(1), torch.device("cpu"))
    assert torch.equal(part, whole[:, 8000:12_345])
