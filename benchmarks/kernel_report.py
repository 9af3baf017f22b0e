"""Ahead-of-time compile report of every Triton kernel configuration the dispatch can choose. No GPU needed.

For each kernel variant (flags the launcher sets), each autotune candidate of seedfast.kernels.configs and
each architecture (sm_90: H100/H200, sm_80: A100), compile with Triton's own toolchain and report
registers, spills (ptxas -v), stack/local bytes (cuobjdump), shared memory, and whether the PTX uses
wgmma (sm_90) or mma (sm_80). Prints a table and writes the report into benchmarks/results/kernel_report.json,
which holds one report per Triton version, {"benchmark": "kernel_report", "by_triton": {"3.9.0": <report>,
"3.6.0": <report>}}: a run replaces its own version's entry and keeps the others.

    python -m benchmarks.kernel_report            # everything, bf16 and fp32 (under a minute on 2 cores)
    python -m benchmarks.kernel_report --quick    # one configuration per kernel variant
    python -m benchmarks.kernel_report --triton 3.6.0   # the same under another Triton (the GPU image's), in a
        # separate virtual environment (~/.cache/seedfast/triton-3.6.0, made with pip on first use; the project's
        # own environment is not touched) -> by_triton["3.6.0"] of the same file. Not run by CI.

Checks (a problem fails the run): compiles; no spills or local memory; shared memory within the limit; wgmma
(sm_90) or mma (sm_80) in 16-bit kernels with a dot; and a pipelined main loop (the innermost loop around the
tensor-core instructions): asynchronous copies inside it, no `cp.async.wait_group 0` inside it, no scalar 16-bit
global loads inside it. Divisibility hints are the ones the launcher passes at the benchmark shapes (N = 16384,
d = 4096, V = 152064: all multiples of 16), plus variants without N's hint (odd micro-batch token counts).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

os.environ.pop("TRITON_INTERPRET", None)  # compile the real kernels, never interpreter stand-ins
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _under_other_triton(argv: list[str]) -> int | None:
    """With --triton VERSION: run this script under that Triton in its own venv (made on first use)."""
    if "--triton" not in argv:
        return None
    i = argv.index("--triton")
    version = argv[i + 1]
    rest = argv[:i] + argv[i + 2:]
    venv = os.path.join(os.path.expanduser("~"), ".cache", "seedfast", f"triton-{version}")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", f"triton=={version}"], check=True)
    # the kernels import nothing but triton, benchmarks.common nothing beyond the standard library at import; the
    # run under that Triton puts its report in the same file (--out, else the committed one), by its own version
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.run([py, "-m", "benchmarks.kernel_report", *rest], env=env, cwd=REPO).returncode


if __name__ == "__main__" and "--triton" in sys.argv:
    sys.exit(_under_other_triton(sys.argv[1:]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from benchmarks.common import update_json_atomic  # noqa: E402
from seedfast.kernels import (  # noqa: E402
    autotuned,
    divergence,
    fused_rows,
    linear_logprob_bwd,
    linear_logprob_fwd,
    token_loss,
)
from seedfast.kernels import configs as C  # noqa: E402

# Largest dynamic shared memory one block may opt into (CUDA programming guide, compute capabilities).
SHARED_LIMIT = {90: 227 * 1024, 80: 163 * 1024}
ARCHS = (90, 80)
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "kernel_report.json")


@dataclass
class Variant:
    """One kernel as the launcher calls it: argument types, fixed constexprs, and its candidate configs."""
    kernel: str
    name: str
    fn: object
    signature: dict[str, str]          # every non-constexpr argument -> Triton type
    constexprs: dict[str, object]      # flags, and strides the JIT sees as 1
    divisible: tuple[str, ...]         # arguments the JIT sees as multiples of 16
    configs: dict = field(default_factory=dict)  # arch -> candidate configs


def _candidates(tuned_name: str, dtype: str) -> dict:
    """What the dispatch can pick: the autotune candidates of seedfast/kernels/autotuned.py, per architecture."""
    return {arch: autotuned.candidates(tuned_name, arch, fp32=dtype == "fp32") for arch in ARCHS}


def _divergence_candidates(grad: bool, dtype: str) -> dict:
    """The divergence kernels' candidates per architecture (configs.py; the launcher, seedfast/ops/
    triton_divergence.py, autotunes over the same lists; read here without importing torch)."""
    if dtype == "fp32":
        lists = C.FP32_DIVERGENCE_GRAD_CONFIGS if grad else C.FP32_DIVERGENCE_CONFIGS
    else:
        lists = C.DIVERGENCE_GRAD_CONFIGS if grad else C.DIVERGENCE_CONFIGS
    return {arch: lists[arch] for arch in ARCHS}


DIVERGENCE_KINDS = (("reverse_kl", divergence.KIND_REVERSE_KL), ("forward_kl", divergence.KIND_FORWARD_KL),
                    ("jsd", divergence.KIND_JSD))


def divergence_variants(dtype: str, prec: str) -> list[Variant]:
    """The divergence kernels (seedfast/kernels/divergence.py) as the launcher calls them, every kind: the online
    statistics, the split merge, the per-shard sums and the recomputed G, with the benchmark shapes' hints."""
    out = []
    strides = dict(stride_hd=1, stride_htd=1, stride_wd=1)
    stats_sig = {**_ptrs(dtype, "h_ptr", "ht_ptr", "w_ptr"),
                 **_ptrs("fp32", "ms_ptr", "ss_ptr", "mt_ptr", "st_ptr", "x_ptr"),
                 "N": "i32", "V": "i32", "D": "i32", "n_splits": "i32", "group_n": "i32", "stride_hn": "i32",
                 "stride_htn": "i32", "stride_wv": "i32", "inv_temp": "fp32"}
    rows_div = ("N", "V", "D", "stride_hn", "stride_htn", "stride_wv")
    sums_sig = {**_ptrs(dtype, "h_ptr", "ht_ptr", "w_ptr"),
                **_ptrs("fp32", "lse_ptr", "tlse_ptr", "value_ptr", "center_ptr"),
                **{k: v for k, v in stats_sig.items() if not k.endswith("_ptr")}, "beta": "fp32"}
    grad_sig = {**_ptrs(dtype, "h_ptr", "ht_ptr", "w_ptr"),
                **_ptrs("fp32", "lse_ptr", "tlse_ptr", "center_ptr", "coef_ptr"), "g_ptr": f"*{dtype}",
                "N": "i32", "D": "i32", "v_start": "i32", "v_stop": "i32", "stride_hn": "i32", "stride_htn": "i32",
                "stride_wv": "i32", "stride_gn": "i32", "inv_temp": "fp32", "scale": "fp32", "beta": "fp32"}
    for label, kind in DIVERGENCE_KINDS:
        flags = dict(KIND=kind, DOT_PRECISION=prec, **strides)
        out.append(Variant("div_stats", label, divergence.divergence_stats_kernel, stats_sig, flags,
                           tuple(k for k in stats_sig if k.endswith("_ptr")) + rows_div,
                           _divergence_candidates(False, dtype)))
        out.append(Variant("div_sums", label, divergence.divergence_sums_kernel, sums_sig, flags,
                           tuple(k for k in sums_sig if k.endswith("_ptr")) + rows_div,
                           _divergence_candidates(False, dtype)))
        out.append(Variant("div_grad", label, divergence.divergence_grad_kernel, grad_sig, flags,
                           tuple(k for k in grad_sig if k.endswith("_ptr")) + ("N", "D", "v_start", "v_stop",
                                                                               "stride_hn", "stride_htn", "stride_wv",
                                                                               "stride_gn"),
                           _divergence_candidates(True, dtype)))
    merge_sig = {**_ptrs("fp32", "ma_ptr", "sa_ptr", "mb_ptr", "sb_ptr", "x_ptr", "lse_a_ptr", "lse_b_ptr", "kl_ptr"),
                 "N": "i32", "n_splits": "i32"}
    for has_x in (False, True):
        out.append(Variant("div_merge", "kl" if has_x else "lse", divergence.divergence_merge_kernel, merge_sig,
                           dict(HAS_X=has_x), tuple(k for k in merge_sig if k.endswith("_ptr")),
                           _same_for_all(triton.Config({"BLOCK": C.REDUCE_BLOCK}, num_warps=4))))
    return out


def _same_for_all(config) -> dict:
    return {arch: [config] for arch in ARCHS}


def _ptrs(dtype: str, *names: str) -> dict[str, str]:
    return {n: f"*{dtype}" for n in names}


def variants(dtype: str = "bf16") -> list[Variant]:
    prec = "ieee" if dtype == "fp32" else "tf32"
    out = []
    fwd_sig = {**_ptrs(dtype, "h_ptr", "ht_ptr", "w_ptr"), "y_ptr": "*i64",
               **_ptrs("fp32", "m_ptr", "s_ptr", "u_ptr", "zy_ptr", "mt_ptr", "st_ptr", "zyt_ptr"),
               "N": "i32", "V": "i32", "D": "i32", "n_splits": "i32", "group_n": "i32", "stride_hn": "i32",
               "stride_htn": "i32", "stride_wv": "i32", "inv_temp": "fp32"}
    # Divisibility by 16 as the launcher passes it at the benchmark shapes (N = 16384, d = 4096, V = 152064).
    fwd_div = ("h_ptr", "ht_ptr", "w_ptr", "y_ptr", "m_ptr", "s_ptr", "u_ptr", "zy_ptr", "mt_ptr", "st_ptr",
               "zyt_ptr", "N", "V", "D", "stride_hn", "stride_htn", "stride_wv")
    for teacher, tuned_name in ((False, "fwd_single"), (True, "fwd_dual")):
        for entropy in (False, True):
            out.append(Variant(
                "fwd", f"{'dual' if teacher else 'single'}{'+entropy' if entropy else ''}",
                linear_logprob_fwd.linear_logprob_fwd_kernel, fwd_sig,
                dict(stride_hd=1, stride_htd=1, stride_wd=1, HAS_TEACHER=teacher, WITH_ENTROPY=entropy,
                     DOT_PRECISION=prec), fwd_div, _candidates(tuned_name, dtype)))
    red_sig = {**_ptrs("fp32", "m_ptr", "s_ptr", "u_ptr", "zy_ptr", "mt_ptr", "st_ptr", "zyt_ptr"),
               "y_ptr": "*i64", **_ptrs("fp32", "logprob_ptr", "entropy_ptr", "lse_ptr", "teacher_logprob_ptr"),
               "N": "i32", "n_splits": "i32", "ignore_index": "i32"}
    for teacher in (False, True):
        for entropy in (False, True):
            out.append(Variant(
                "reduce", f"{'dual' if teacher else 'single'}{'+entropy' if entropy else ''}",
                linear_logprob_fwd.linear_logprob_reduce_kernel, red_sig,
                dict(HAS_TEACHER=teacher, WITH_ENTROPY=entropy), tuple(k for k in red_sig if k.endswith("_ptr")),
                _same_for_all(triton.Config({"BLOCK": C.REDUCE_BLOCK}, num_warps=4))))
    grad_sig = {**_ptrs(dtype, "h_ptr", "w_ptr"), "y_ptr": "*i64",
                **_ptrs("fp32", "lse_ptr", "ent_ptr", "a_ptr", "b_ptr"), "g_ptr": f"*{dtype}",
                "N": "i32", "D": "i32", "v_start": "i32", "v_stop": "i32", "stride_hn": "i32", "stride_wv": "i32",
                "stride_gn": "i32", "inv_temp": "fp32", "scale": "fp32", "ignore_index": "i32"}
    # What the launcher passes at the benchmark shapes: N = 16384 tokens, d = 4096, chunk starts and the G row
    # stride multiples of 256 (choose_grad_chunk); v_stop = V = 152064 = 16·9504 too.
    grad_div = tuple(k for k in grad_sig if k.endswith("_ptr")) + ("N", "D", "v_start", "v_stop", "stride_hn",
                                                                    "stride_wv", "stride_gn")
    for has_b in (False, True):
        out.append(Variant("grad_logits", "a+b" if has_b else "a", linear_logprob_bwd.linear_logprob_grad_logits_kernel,
                           grad_sig, dict(stride_hd=1, stride_wd=1, HAS_B=has_b, DOT_PRECISION=prec), grad_div,
                           _candidates("grad_logits", dtype)))
    # The single pass's row kernels (memory-bound, no dot): Z fp32 [R, V], G in the input dtype (fp32: in place).
    stats_sig = {"z_ptr": "*fp32", "y_ptr": "*i64", **_ptrs("fp32", "lse_ptr", "logprob_ptr", "entropy_ptr"),
                 "R": "i32", "V": "i32", "stride_zr": "i32", "inv_temp": "fp32", "ignore_index": "i32"}
    rows_div = ("V", "stride_zr")
    for entropy in (False, True):
        out.append(Variant("row_stats", "+entropy" if entropy else "plain", fused_rows.row_stats_kernel, stats_sig,
                           dict(WITH_ENTROPY=entropy, **C.ROW_STATS),
                           tuple(k for k in stats_sig if k.endswith("_ptr")) + rows_div,
                           _same_for_all(triton.Config({}, num_warps=C.ROW_STATS_NUM_WARPS))))
    g_sig = {"z_ptr": "*fp32", "y_ptr": "*i64", **_ptrs("fp32", "lse_ptr", "ent_ptr", "a_ptr", "b_ptr"),
             "g_ptr": f"*{dtype}", "R": "i32", "V": "i32", "stride_zr": "i32", "stride_gr": "i32", "inv_temp": "fp32",
             "scale": "fp32", "ignore_index": "i32"}
    for has_b in (False, True):
        out.append(Variant("grad_rows", "a+b" if has_b else "a", fused_rows.grad_from_logits_kernel, g_sig,
                           dict(HAS_B=has_b, **C.GRAD_FROM_LOGITS),
                           tuple(k for k in g_sig if k.endswith("_ptr")) + rows_div + ("stride_gr",),
                           _same_for_all(triton.Config({}, num_warps=C.GRAD_FROM_LOGITS_NUM_WARPS))))
    tl_sig = {**_ptrs("fp32", "lp_ptr", "ent_ptr", "old_ptr", "ref_ptr", "teacher_ptr", "tmask_ptr", "adv_ptr",
                      "w_ptr", "a_ptr", "b_ptr", "stats_ptr"), "N": "i32",
              **{k: "fp32" for k in ("clip_low", "clip_high", "dual_clip", "kl_coef", "entropy_coef", "opd_coef",
                                     "opd_beta", "opd_adv_clip")}}
    def loss_flags(entropy, kl_kind, opd, gate, opd_mode=token_loss.OPD_GATE):
        return dict(HAS_ENTROPY=entropy, HAS_DUAL_CLIP=True, KL_KIND=kl_kind, HAS_OPD=opd, HAS_TMASK=opd,
                    GATE=gate, OPD_MODE=opd_mode, WRITE_B=entropy)

    # Every branch of the kernel: the three KL kinds and the three gates, the advantage form, and the plain policy
    # loss (also what the divergence forms run: no teacher term).
    loss_variants = (("k3+soft_or+H", loss_flags(True, 3, True, 2)), ("k1+gap", loss_flags(False, 1, True, 0)),
                     ("k2+entropy gate", loss_flags(True, 2, True, 1)),
                     ("k3+advantage", loss_flags(False, 3, True, 0, token_loss.OPD_ADVANTAGE)),
                     ("pg only", loss_flags(False, 0, False, 0, token_loss.OPD_NONE)))
    for label, flags in loss_variants:
        out.append(Variant("token_loss", label, token_loss.token_loss_kernel, tl_sig, flags,
                           tuple(k for k in tl_sig if k.endswith("_ptr")),
                           _same_for_all(triton.Config({"BLOCK": C.TOKEN_LOSS_BLOCK},
                                                       num_warps=C.TOKEN_LOSS_NUM_WARPS))))
    out += divergence_variants(dtype, prec)
    # A micro-batch's token count is rarely a multiple of 16: the JIT then compiles a variant without N's hint.
    for v in [v for v in out if (v.kernel, v.name) in (("fwd", "single+entropy"), ("grad_logits", "a+b"),
                                                       ("div_stats", "reverse_kl"), ("div_grad", "jsd"))]:
        out.append(Variant(v.kernel, v.name + " N%16!=0", v.fn, v.signature, v.constexprs,
                           tuple(k for k in v.divisible if k != "N"), v.configs))
    return out


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def _ptxas(arch: int) -> str:
    """The ptxas Triton itself uses for `arch` (its PTX version matches that ptxas)."""
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(arch).path


def _resource_usage(cubin: bytes) -> dict[str, int]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", f.name], capture_output=True,
                              text=True, check=True).stdout
    fields = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text))
    return {k.lower(): int(v) for k, v in fields.items()}


def _ptxas_spills(ptx: str, arch: int) -> tuple[int, int]:
    gpu = "sm_90a" if arch == 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        log = subprocess.run([_ptxas(arch), f"-arch={gpu}", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True, check=True).stderr
    stores, loads = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log).groups()
    return int(stores), int(loads)


_LABEL = re.compile(r"^(\$L__BB\d+_\d+):")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+);")
# A global load of one 16-bit element (no .v2/.v4 vector): a tensor-core operand fetched element by element.
_SCALAR_16BIT_LOAD = re.compile(r"\bld\.global(?:\.[a-zA-Z0-9_:]+)*?\.(?:b16|u16|s16|f16|bf16)\b")


def pipelining(ptx: str) -> dict:
    """How the main loop (an innermost loop of the PTX holding wgmma or mma) moves its operands.

    A loop is a label and a later branch back to it. Pipelined Triton loops keep `cp.async.wait_group N` with
    N = num_stages - 2 > 0 (or TMA barriers) inside; `cp.async.wait_group 0` inside the loop means every
    iteration waits for its own loads (no overlap), and scalar 16-bit global loads mean the operands are not
    even vectorized (what an operand without divisibility hints compiles to)."""
    lines = ptx.splitlines()
    labels = {}
    loops = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        label = _LABEL.match(stripped)
        if label:
            labels[label.group(1)] = i
        branch = _BRANCH.search(stripped)
        if branch and branch.group(1) in labels:  # target defined above: a back edge
            loops.append((labels[branch.group(1)], i))
    innermost = [(a, b) for a, b in loops if not any(a < c and d < b for c, d in loops if (c, d) != (a, b))]
    main = [(a, b) for a, b in innermost if any("wgmma.mma_async" in x or "mma.sync" in x for x in lines[a:b + 1])]
    body = [x.strip() for a, b in main for x in lines[a:b + 1]]
    return {
        "main_loops": len(main),
        "wait_group_0_in_main_loop": any(x.startswith("cp.async.wait_group 0;") for x in body),
        "async_copies_in_main_loop": sum("cp.async.cg" in x or "cp.async.ca" in x or "cp.async.bulk" in x
                                         for x in body),
        "scalar_16bit_loads_in_main_loop": sum(bool(_SCALAR_16BIT_LOAD.search(x)) for x in body),
        "wgmma_wait_groups_in_main_loop": sorted({int(x.split()[-1].rstrip(";")) for x in body
                                                  if x.startswith("wgmma.wait_group")}),
    }


def compile_one(variant: Variant, config, arch: int) -> dict:
    fn = variant.fn
    constexprs = {**variant.constexprs, **config.kwargs}
    signature = {name: variant.signature.get(name, "constexpr") for name in fn.arg_names}
    missing = [n for n, t in signature.items() if t == "constexpr" and n not in constexprs]
    if missing:
        raise ValueError(f"{variant.kernel}/{variant.name}: no type or value for {missing}")
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in variant.divisible}
    row = {"arch": f"sm_{arch}", "kernel": variant.kernel, "variant": variant.name,
           "config": {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}}
    start = time.perf_counter()
    try:
        compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", arch, 32),
                                  options={"num_warps": config.num_warps, "num_stages": config.num_stages})
    except Exception as err:  # noqa: BLE001 - a failed configuration is a result of the report
        row.update(ok=False, error=f"{type(err).__name__}: {str(err)[:300]}")
        return row
    ptx = compiled.asm["ptx"]
    usage = _resource_usage(compiled.asm["cubin"])
    spill_stores, spill_loads = _ptxas_spills(ptx, arch)
    row.update(ok=True, seconds=round(time.perf_counter() - start, 2), registers=usage.get("reg"),
               stack_bytes=usage.get("stack"), local_bytes=usage.get("local"), spill_stores=spill_stores,
               spill_loads=spill_loads, shared_bytes=compiled.metadata.shared, shared_limit=SHARED_LIMIT[arch],
               wgmma="wgmma" in ptx, mma="mma.sync" in ptx, **pipelining(ptx))
    return row


def _job(args):
    kernel, name, index, arch, dtype = args
    variant = next(v for v in variants(dtype) if v.kernel == kernel and v.name == name)
    return {**compile_one(variant, variant.configs[arch][index], arch), "dtype": dtype}


def _uses_dot(kernel: str) -> bool:
    return kernel in ("fwd", "grad_logits", "div_stats", "div_sums", "div_grad")


def check(rows: list[dict]) -> list[str]:
    """The properties the kernels must have; one message per violation."""
    problems = []
    for r in rows:
        where = f"{r['arch']} {r['kernel']} {r['variant']} {r['config']}"
        if not r["ok"]:
            problems.append(f"{where}: does not compile: {r['error']}")
            continue
        if r["spill_stores"] or r["spill_loads"] or r["local_bytes"]:
            problems.append(f"{where}: spills ({r['spill_stores']} B stores, {r['spill_loads']} B loads)")
        if r["shared_bytes"] > r["shared_limit"]:
            problems.append(f"{where}: {r['shared_bytes']} B shared memory > {r['shared_limit']} B")
        if _uses_dot(r["kernel"]) and r.get("dtype", "bf16") != "fp32":
            if r["arch"] == "sm_90" and not r["wgmma"]:
                problems.append(f"{where}: no wgmma in the sm_90 PTX")
            if r["arch"] == "sm_80" and not r["mma"]:
                problems.append(f"{where}: no mma in the sm_80 PTX")
            if not r["main_loops"]:
                problems.append(f"{where}: no loop around the tensor-core instructions found in the PTX")
            if r["wait_group_0_in_main_loop"]:
                problems.append(f"{where}: unpipelined main loop (cp.async.wait_group 0 inside it)")
            if r["scalar_16bit_loads_in_main_loop"]:
                problems.append(f"{where}: {r['scalar_16bit_loads_in_main_loop']} scalar 16-bit global loads in "
                                "the main loop (operands not vectorized)")
            if not r["async_copies_in_main_loop"]:
                problems.append(f"{where}: no asynchronous copies in the main loop (loads not pipelined)")
    return problems


def table(rows: list[dict]) -> str:
    head = f"{'arch':6} {'kernel':11} {'variant':15} {'tile':16} {'w':>2} {'s':>2} {'regs':>4} {'spill':>9} " \
           f"{'stack':>5} {'smem KB':>7} {'tc':5} {'sec':>5}"
    lines = [head, "-" * len(head)]
    for r in rows:
        cfg = r["config"]
        tile = "x".join(str(v) for k, v in cfg.items() if k.startswith("BLOCK"))
        if not r["ok"]:
            lines.append(f"{r['arch']:6} {r['kernel']:11} {r['variant']:15} {tile:16} FAILED {r['error'][:60]}")
            continue
        tc = "wgmma" if r["wgmma"] else "mma" if r["mma"] else "-"
        if _uses_dot(r["kernel"]) and r.get("dtype") != "fp32":  # fp32 runs on FMA units: no tensor-core loop
            tc += "" if r["main_loops"] and not r["wait_group_0_in_main_loop"] else "!"
        lines.append(f"{r['arch']:6} {r['kernel']:11} {r['variant']:15} {tile:16} {cfg['num_warps']:>2} "
                     f"{cfg['num_stages']:>2} {r['registers']:>4} {r['spill_stores']:>4}/{r['spill_loads']:<4} "
                     f"{r['stack_bytes']:>5} {r['shared_bytes'] / 1024:>7.1f} {tc:5} {r['seconds']:>5}")
    return "\n".join(lines)


def run(quick: bool = False, archs=ARCHS, dtypes=("bf16",), jobs: int = 1, only=None) -> list[dict]:
    """Compile every (variant, config, arch); `only` restricts to "kernel" or "kernel/variant" names."""
    work = []
    for dtype in dtypes:
        for v in variants(dtype):
            if only and v.kernel not in only and f"{v.kernel}/{v.name}" not in only:
                continue
            for arch in archs:
                for index in range(1 if quick else len(v.configs[arch])):
                    work.append((v.kernel, v.name, index, arch, dtype))
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            return list(pool.map(_job, work))
    return [_job(w) for w in work]


def save(report: dict, path: str = RESULTS) -> None:
    """Put the report at by_triton[its Triton version] of the results file, the other versions' reports kept."""
    update_json_atomic(path, ("by_triton", report["versions"]["triton"]), report,
                       base={"benchmark": "kernel_report", "by_triton": {}})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="first configuration of each variant only")
    parser.add_argument("--arch", type=int, action="append", choices=ARCHS, help="default: 90 and 80")
    parser.add_argument("--dtype", action="append", choices=("bf16", "fp16", "fp32"), help="default: bf16, fp32")
    parser.add_argument("--only", action="append",
                        help="only this kernel (fwd, reduce, grad_logits, row_stats, grad_rows, token_loss, "
                             "div_stats, div_merge, div_sums, div_grad) or kernel/variant")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default=RESULTS, help="the file to put this Triton version's report in (others "
                        "kept; default: the committed one)")
    parser.add_argument("--triton", metavar="VERSION", help="run under this Triton version (separate venv)")
    args = parser.parse_args(argv)
    start = time.time()
    rows = run(args.quick, tuple(args.arch or ARCHS), tuple(args.dtype or ("bf16", "fp32")), args.jobs, args.only)
    problems = check(rows)
    print(table(rows))
    print(f"\n{len(rows)} compilations in {time.time() - start:.0f} s; "
          f"{'all checks pass' if not problems else f'{len(problems)} problems:'}")
    for p in problems:
        print("  " + p)
    report = {"machine": {"host": platform.node(), "cpu": platform.processor() or platform.machine(),
                          "python": platform.python_version()},
              "versions": {"triton": triton.__version__},
              "note": "ahead-of-time compilation with Triton's ptxas/cuobjdump; no GPU involved",
              "shared_limit_bytes": {f"sm_{a}": SHARED_LIMIT[a] for a in ARCHS},
              "rows": rows, "problems": problems}
    save(report, args.out)
    print(f"wrote by_triton[{triton.__version__!r}] of {args.out}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
