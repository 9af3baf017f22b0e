"""Ahead-of-time compilation of the kernels for sm_90 and sm_80 (no GPU): they compile, use the tensor
cores (wgmma on sm_90, mma on sm_80), do not spill, and fit in shared memory. Runs the report script in a
fresh process: the kernels must be real @triton.jit functions, not interpreter ones."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The heaviest variant of each GEMM-like kernel, first autotune candidate (the full list: run the script).
ONLY = ["fwd/single+entropy", "fwd/dual+entropy", "grad_logits/a+b", "matmul/dH+=G.W"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    pytest.importorskip("triton")
    out = tmp_path_factory.mktemp("report") / "kernel_report.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = [sys.executable, str(REPO / "benchmarks" / "kernel_report.py"), "--quick", "--dtype", "bf16", "--jobs", "2",
            "--out", str(out)]
    for name in ONLY:
        args += ["--only", name]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc


def test_every_variant_compiles_for_both_architectures(report):
    data, proc = report
    rows = data["rows"]
    seen = {(r["arch"], f"{r['kernel']}/{r['variant']}") for r in rows}
    assert seen == {(arch, name) for arch in ("sm_90", "sm_80") for name in ONLY}
    assert all(r["ok"] for r in rows), [r.get("error") for r in rows if not r["ok"]]


def test_tensor_cores_no_spills_shared_memory_fits(report):
    data, proc = report
    for r in data["rows"]:
        where = f"{r['arch']} {r['kernel']}/{r['variant']}"
        assert r["wgmma"] if r["arch"] == "sm_90" else r["mma"], f"{where}: no tensor-core instruction"
        assert r["spill_stores"] == r["spill_loads"] == r["local_bytes"] == 0, f"{where}: spills"
        assert 0 < r["shared_bytes"] <= r["shared_limit"], f"{where}: shared memory {r['shared_bytes']} B"
    assert data["shared_limit_bytes"] == {"sm_90": 227 * 1024, "sm_80": 163 * 1024}
    assert data["problems"] == [] and proc.returncode == 0, proc.stdout[-2000:]
