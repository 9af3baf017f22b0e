"""benchmarks/gemm_reference.py without a GPU: the row kernels it times run with the single pass's arguments (under
the interpreter here) and compute what the single pass needs (against torch: lse, log-prob, entropy, G), so that the
window's measurement of them cannot die on an argument slip; without CUDA it writes the shapes it would measure."""

import json
from pathlib import Path

import pytest
import torch

from tests.kernels.triton_reference import INTERPRETER

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gemm_ref():
    from benchmarks import gemm_reference

    return gemm_reference


@INTERPRETER
def test_row_kernels_it_times_compute_the_row_statistics_and_g(gemm_ref):
    stats, grad, t = gemm_ref.row_pass_launchers(torch, 10, 300, device="cpu")
    stats()
    grad()
    z, y = t["z"].double(), t["y"]
    logp = torch.log_softmax(z, dim=-1)
    p = logp.exp()
    ent = -(p * logp).sum(-1)
    torch.testing.assert_close(t["lse"].double(), torch.logsumexp(z, -1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(t["logprob"].double(), logp.gather(1, y[:, None])[:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(t["entropy"].double(), ent, rtol=1e-5, atol=1e-5)
    onehot = torch.zeros_like(p).scatter_(1, y[:, None], 1.0)
    g = t["a"].double()[:, None] * (onehot - p) - t["b"].double()[:, None] * p * (logp + ent[:, None])
    torch.testing.assert_close(t["g"].double(), g, rtol=1e-2, atol=1e-2)  # bf16 G


def test_without_cuda_it_writes_the_shapes_it_would_measure(gemm_ref, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the real measurement")
    out = tmp_path / "g.json"
    assert gemm_ref.main([str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["gpu"] is None and saved["shape"]["R"] == 2048 and saved["shape"]["chunk"] == 8192
    assert set(saved["shape"]["gemms"]) == {"logits", "dw", "dh", "block_logits_f32", "block_dh", "block_dw_f32c",
                                            "chunk_dw", "chunk_dh_f32c"}
