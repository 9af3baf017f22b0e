"""Tensor parallel (TP=2, 2 CPU processes over gloo): the decoder's forward, the vocabulary-parallel linear_logprob
and fused loss, and a whole update through them equal one process (values and every gradient), and the
vocabulary-parallel head never allocates anything of the order of [tokens x V]."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from seedfast.config import LossConfig
from seedfast.distributed.mesh import MESH_DIMS
from seedfast.distributed.parallelize import apply_tp
from seedfast.distributed.vocab_head import tp_fused_divergence, tp_fused_loss, tp_linear_logprob
from seedfast.model.decoder import build_decoder
from seedfast.ops import LossOptions, fused_divergence, fused_loss, linear_logprob, tiles
from seedfast.scoring.packing import pack_single
from seedfast.train.update import UpdateBatch, minibatch_loss_backward
from tests.distributed.dist_helpers import grouped_samples, make_config, run_on_ranks
from tests.largest_tensor import LargestTensor

LOSS = LossConfig(opd_coef=0.0, entropy_coef=0.01, kl_coef=0.0)


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _model_case(family, tp_mesh):
    torch.manual_seed(0)
    cfg = make_config(family, vocab_size=203)  # odd: shards of 102 and 101 rows
    ref = build_decoder(cfg, dtype=torch.float32, seed=4)
    model = apply_tp(copy.deepcopy(ref), tp_mesh)
    assert model.model.layers[0].self_attn.n_heads == cfg.num_attention_heads // 2
    samples = grouped_samples(9, 6)
    packed = pack_single(samples)

    # forward: the same final hidden states
    h_ref = ref(packed.input_ids, packed.cu_seqlens, position_ids=packed.position_ids)
    h_tp = model(packed.input_ids, packed.cu_seqlens, position_ids=packed.position_ids)
    torch.testing.assert_close(h_tp, h_ref, rtol=1e-5, atol=1e-5)

    # linear_logprob with entropy and a teacher context: values and both gradients
    g = torch.Generator().manual_seed(1)
    rows = h_ref[packed.rows].detach()
    teacher = rows + 0.1 * torch.randn(rows.shape, generator=g)
    gl, ge = torch.randn(len(rows), generator=g), torch.randn(len(rows), generator=g)
    w_ref = ref.lm_head_weight
    h1 = rows.clone().requires_grad_()
    out_ref = linear_logprob(h1, w_ref, packed.targets, teacher_hidden=teacher, temperature=0.9, with_entropy=True)
    ((out_ref.logprob * gl).sum() + (out_ref.entropy * ge).sum()).backward()
    h2 = rows.clone().requires_grad_()
    out = tp_linear_logprob(h2, model.lm_head_weight, packed.targets, teacher_hidden=teacher, temperature=0.9,
                            with_entropy=True)
    ((out.logprob * gl).sum() + (out.entropy * ge).sum()).backward()
    for a, b in ((out.logprob, out_ref.logprob), (out.entropy, out_ref.entropy),
                 (out.teacher_logprob, out_ref.teacher_logprob), (h2.grad, h1.grad)):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(_full(model.lm_head_weight.grad), w_ref.grad, rtol=1e-5, atol=1e-6)
    ref.zero_grad(set_to_none=True)
    model.zero_grad(set_to_none=True)

    # a whole GRPO update through the vocabulary-parallel fused loss: loss, metrics, every gradient
    batch = UpdateBatch(samples, torch.linspace(-1, 1, len(samples)), None)
    args = dict(use_kl=False, use_opd=False, temperature=1.1, token_budget=40)
    loss_ref, m_ref = minibatch_loss_backward(ref, batch, list(range(len(samples))), LOSS, **args)
    loss, m = minibatch_loss_backward(model, batch, list(range(len(samples))), LOSS, **args)
    assert loss == pytest.approx(loss_ref, rel=1e-5)
    for k in m_ref:
        assert m[k] == pytest.approx(m_ref[k], rel=1e-5, abs=1e-7), k
    grads = {n: _full(p.grad) for n, p in model.named_parameters()}
    for n, p in ref.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)


def _no_logits_case(rank, world):
    n, d, v = 256, 8, 2048
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(n, d, generator=g)
    weight = torch.randn(v, d, generator=g) * 0.5
    targets = torch.randint(0, v, (n,), generator=g)
    adv, w = torch.randn(n, generator=g), torch.full((n,), 1.0 / n)
    mesh = init_device_mesh("cpu", (world,))
    w_tp = torch.nn.Parameter(distribute_tensor(weight, mesh, [Shard(0)]))
    h = hidden.clone().requires_grad_()
    with LargestTensor() as control:  # the detector sees one shard's materialized logits
        (hidden @ w_tp.to_local().T).logsumexp(-1).sum()
    assert control.numel == n * (v // world)
    with LargestTensor() as seen:
        loss, _ = tp_fused_loss(h, w_tp, targets, token_weights=w, advantages=adv, old_logprob=None,
                                options=LossOptions(entropy_coef=0.01))
        loss.backward()
    local = v // world
    # tiles of 4096 fp32 logits (SEEDFAST_OPS_TILE_BYTES), the local dW [V/2, d] and [N] vectors: nothing near
    # the [N, V/2] = 262,144 logits of one shard, let alone [N, V]
    assert seen.numel <= max(4096, local * d, n) < n * local // 16, seen.numel
    h_ref = hidden.clone().requires_grad_()
    w_ref = weight.clone().requires_grad_()
    loss_ref, _ = fused_loss(h_ref, w_ref, targets, token_weights=w, advantages=adv, old_logprob=None,
                             options=LossOptions(entropy_coef=0.01))
    loss_ref.backward()
    assert float(loss) == pytest.approx(float(loss_ref), rel=1e-5)
    torch.testing.assert_close(h.grad, h_ref.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w_tp.grad.full_tensor(), w_ref.grad, rtol=1e-5, atol=1e-6)


def _divergence_case(rank, world):
    """The full-vocabulary teacher terms on a vocabulary split over the ranks (203 rows: shards of 102 and 101) equal
    one process: values, ∂/∂hidden and each rank's rows of ∂/∂W; nothing of the order of [N, V/2] is allocated."""
    n, d, v = 64, 8, 203
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(n, d, generator=g)
    teacher = hidden + 0.5 * torch.randn(n, d, generator=g)
    weight = torch.randn(v, d, generator=g)
    weights = torch.rand(n, generator=g)
    weights[:5] = 0.0
    mesh = init_device_mesh("cpu", (world,))
    for kind, beta in (("reverse_kl", 1.0), ("forward_kl", 0.0), ("jsd", 0.3)):
        w_tp = torch.nn.Parameter(distribute_tensor(weight, mesh, [Shard(0)]))
        h = hidden.clone().requires_grad_()
        with LargestTensor() as seen:
            loss, value = tp_fused_divergence(h, teacher, w_tp, token_weights=weights, kind=kind, beta=beta,
                                              temperature=0.8)
            loss.backward()
        assert seen.numel < n * (v // world), seen.numel
        h_ref, w_ref = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss_ref, value_ref = fused_divergence(h_ref, teacher, w_ref, token_weights=weights, kind=kind, beta=beta,
                                               temperature=0.8)
        loss_ref.backward()
        assert float(loss) == pytest.approx(float(loss_ref), rel=1e-5), kind
        torch.testing.assert_close(value, value_ref, rtol=1e-5, atol=1e-5)  # D near 0: fp32 sums of O(1) terms
        # fp32 sums in another order (per shard, then across): a few 1e-6 on gradients of order 1
        torch.testing.assert_close(h.grad, h_ref.grad, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(w_tp.grad.full_tensor(), w_ref.grad, rtol=1e-4, atol=1e-5)


def _worker(rank, world):
    tp_mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=MESH_DIMS)["tp"]
    for family in ("qwen3", "qwen2"):  # untied LM head; tied embeddings with q/k/v bias
        _model_case(family, tp_mesh)
    _no_logits_case(rank, world)
    _divergence_case(rank, world)


def test_tp2_forward_logprob_loss_and_update_equal_one_process(monkeypatch):
    monkeypatch.setenv(tiles.TILE_BYTES_ENV, str(16 << 10))  # inherited by the spawned ranks
    assert os.environ[tiles.TILE_BYTES_ENV]
    run_on_ranks(2, _worker)
