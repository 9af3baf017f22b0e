"""No op ever allocates anything of the order of the [N, V] logits (docs/performance.md, 'No full-vocabulary logits':
O(N + tile) memory)."""

import torch

from seedfast.ops import LossOptions, fused_loss, linear_logprob, tiles
from tests.largest_tensor import LargestTensor
from tests.ops.ops_reference import materialized_logprob, random_problem

N, D, V = 256, 8, 2048


def test_detector_sees_materialized_logits():
    hidden, weight, targets = random_problem(N, D, V)
    with LargestTensor() as seen:
        materialized_logprob(hidden, weight, targets)[0].sum().backward()
    assert seen.numel >= N * V


def test_linear_logprob_and_fused_loss_stay_within_tiles(monkeypatch):
    monkeypatch.setenv(tiles.TILE_BYTES_ENV, str(16 << 10))  # 4096 fp32 logits per tile
    hidden, weight, targets = random_problem(N, D, V, seed=1, ignored=10)
    teacher = torch.randn(N, D)
    with LargestTensor() as seen:
        out = linear_logprob(hidden, weight, targets, teacher_hidden=teacher, with_entropy=True)
        (out.logprob.sum() + out.entropy.sum()).backward()
        loss, _ = fused_loss(hidden, weight, targets, token_weights=torch.full((N,), 1.0 / N),
                             advantages=torch.randn(N), old_logprob=out.logprob.detach(),
                             ref_logprob=out.logprob.detach(), teacher_logprob=out.teacher_logprob,
                             options=LossOptions(kl_coef=0.1, entropy_coef=0.01, opd_coef=0.1, gate="soft_or"))
        loss.backward()
    # The largest tensors are the [V, d] weight gradient and a 4096-entry tile; [N, V] would be 524288.
    assert seen.numel <= max(V * D, 4096)
