"""Ahead-of-time compilation of the kernels for sm_90 and sm_80 (no GPU): they compile, use the tensor
cores (wgmma on sm_90, mma on sm_80), keep their main loop pipelined, do not spill, and fit in shared memory.
Runs the report script in a fresh process: the kernels must be real @triton.jit functions, not interpreter
ones; it puts its report at by_triton[its Triton version] of the results file and keeps the other versions'. The
PTX loop analysis is also checked on hand-written PTX, pipelined and not."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The heaviest variant of each GEMM-like kernel, first autotune candidate (the full list: run the script).
ONLY = ["fwd/single+entropy", "fwd/dual+entropy", "grad_logits/a+b", "grad_rows/a+b", "div_stats/reverse_kl",
        "div_grad/jsd"]


OTHER = {"versions": {"triton": "0.0.0"}, "rows": [], "problems": []}  # another Triton's report, already there


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    triton = pytest.importorskip("triton")
    out = tmp_path_factory.mktemp("report") / "kernel_report.json"
    out.write_text(json.dumps({"benchmark": "kernel_report", "by_triton": {"0.0.0": OTHER}}))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = [sys.executable, "-m", "benchmarks.kernel_report", "--quick", "--dtype", "bf16", "--jobs", "2",
            "--out", str(out)]
    for name in ONLY:
        args += ["--only", name]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    written = json.loads(out.read_text())
    assert triton.__version__ in written["by_triton"], proc.stdout[-3000:] + proc.stderr[-3000:]
    assert written["benchmark"] == "kernel_report" and written["by_triton"]["0.0.0"] == OTHER  # the other kept
    assert list(written["by_triton"]) == ["0.0.0", triton.__version__]
    return written["by_triton"][triton.__version__], proc


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
        if r["kernel"] != "grad_rows":  # grad_rows is elementwise: no dot
            assert r["wgmma"] if r["arch"] == "sm_90" else r["mma"], f"{where}: no tensor-core instruction"
        assert r["spill_stores"] == r["spill_loads"] == r["local_bytes"] == 0, f"{where}: spills"
        assert 0 < r["shared_bytes"] <= r["shared_limit"] or r["kernel"] == "grad_rows", f"{where}: shared memory"
        if r["kernel"] != "grad_rows":  # the kernels with a tensor-core main loop
            assert r["main_loops"] >= 1 and r["async_copies_in_main_loop"] > 0, f"{where}: main loop not found"
            assert not r["wait_group_0_in_main_loop"] and r["scalar_16bit_loads_in_main_loop"] == 0, where
    assert data["shared_limit_bytes"] == {"sm_90": 227 * 1024, "sm_80": 163 * 1024}
    assert data["problems"] == [] and proc.returncode == 0, proc.stdout[-2000:]


def _load_report_module():
    """The report module, loaded in this process (it unsets TRITON_INTERPRET on import: restored here)."""
    import importlib

    saved = os.environ.get("TRITON_INTERPRET")
    try:
        module = importlib.import_module("benchmarks.kernel_report")
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved
    return module


_PIPELINED = """
$L__BB0_4:
	cp.async.wait_group 2;
	cp.async.cg.shared.global [ %r1 + 0 ], [ %rd2 + 0 ], 0x10, %r3;
	wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%r4}, %rd5, %rd6, p, 1, 1, 0, 1;
	wgmma.wait_group.sync.aligned 1;
	@%p25 bra $L__BB0_4;
	cp.async.wait_group 0;
"""
_UNPIPELINED = """
$L__BB0_3:
	@%p1 ld.global.b16 { %rs1 }, [ %rd1 + 0 ];
	@%p1 ld.global.b16 { %rs2 }, [ %rd2 + 0 ];
	cp.async.wait_group 0;
	wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r4}, %rd5, %rd6, p, 1, 1, 0, 1;
	wgmma.wait_group.sync.aligned 0;
	bra.uni $L__BB0_3;
"""


def test_pipelining_analysis_sees_unpipelined_main_loops():
    pipelining = _load_report_module().pipelining
    good = pipelining(_PIPELINED)
    assert good["main_loops"] == 1 and not good["wait_group_0_in_main_loop"]  # the drain after the loop is fine
    assert good["async_copies_in_main_loop"] == 1 and good["scalar_16bit_loads_in_main_loop"] == 0
    assert good["wgmma_wait_groups_in_main_loop"] == [1]
    bad = pipelining(_UNPIPELINED)
    assert bad["main_loops"] == 1 and bad["wait_group_0_in_main_loop"]
    assert bad["scalar_16bit_loads_in_main_loop"] == 2 and bad["async_copies_in_main_loop"] == 0
    assert pipelining("\tret;\n")["main_loops"] == 0
