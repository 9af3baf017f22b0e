#!/usr/bin/env bash
# One short GPU window: the CUDA tests (pytest -m gpu), FSDP2 on a 1-rank mesh (one SEED and one GRPO update equal
# the plain update, tests/dist/test_fsdp_one_device.py), the RL step at the random-init Qwen2.5-1.5B shape (SEED vs
# GRPO: tokens/s, MFU, peak memory; benchmarks/step_gpu.py), the kernel microbenchmarks and one RL update side by
# side with the reference recipe (benchmarks/peers.py, Qwen2.5-1.5B shape, bf16). No network, installs nothing.
# The whole script stays inside BUDGET_S seconds (default 540: one 10-minute device command with room to copy the
# results back): each step's time limit is its own or what is left of the budget, whichever is smaller, and a step
# with under 20 s left is skipped and reported as such.
#
#   benchmarks/gpu_check.sh OUT_DIR          (from anywhere; PYTHON=/path/to/python, BUDGET_S=seconds)
#
# Writes OUT_DIR/{env.txt, gemm_reference.json, nvidia-smi.txt, pytest_gpu.xml (JUnit), pytest_gpu.log,
# fsdp_1gpu.log, step_gpu.log, step_gpu.json, kernels.log, kernels.json, kernels.png, peers.log, peers_cuda.json,
# summary.txt}. Exit status: non-zero when a test failed, a
# test file failed to import, or a step ran past its time limit. A test file that fails to import is reported and
# the other files' tests still run (--continue-on-collection-errors).
set -uo pipefail

OUT=${1:?usage: benchmarks/gpu_check.sh OUT_DIR}
PY=${PYTHON:-python}
REPO=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$REPO"

# Nothing is installed: every Python step puts the repository first on sys.path.
BOOT="import sys
sys.path.insert(0, '$REPO')"
py() { local code=$1; shift; "$PY" -c "$BOOT
$code" "$@"; }
export PYTHONDONTWRITEBYTECODE=1
BUDGET_S=${BUDGET_S:-540}
MIN_STEP_S=${MIN_STEP_S:-20}
T0=$(date +%s)
# limit SECONDS: the step's own limit, or what is left of the budget; 0 when under MIN_STEP_S are left (skip it)
limit() { local left=$(( BUDGET_S - ($(date +%s) - T0) )); [ "$left" -lt "$MIN_STEP_S" ] && { echo 0; return; }
  [ "$1" -lt "$left" ] && echo "$1" || echo "$left"; }
# timed SECONDS cmd...: run under the budgeted limit; exit 125 = skipped for lack of budget, 124 = ran out of time
timed() { local t; t=$(limit "$1"); shift; [ "$t" -eq 0 ] && return 125; timeout "$t" "$@"; }

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  git rev-parse HEAD 2>/dev/null || true
  py "import torch, triton, seedfast.kernels as k; print('python', sys.version.split()[0]);
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cublas', torch.backends.cuda.preferred_blas_library());
print('triton', triton.__version__);
print('gpu', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None); print('kernels', k.__file__)"
} > "$OUT/env.txt" 2>&1
command -v nvidia-smi >/dev/null && nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1

# The reference the kernels are judged against: a cuBLAS bf16 GEMM of the logits shape (N=4096, d=4096,
# V=152064), a device copy's bandwidth, and whether torch takes an fp32 C beside bf16 inputs in one cuBLAS call
# (seedfast/ops/triton_backend.py, GEMM_F32_MODE: "addmm", else the slower "mm+add").
timed 40 "$PY" -c "$BOOT
import json, torch, triton
from seedfast.ops import triton_backend as tb
out = {'torch': torch.__version__, 'cuda': torch.version.cuda, 'triton': triton.__version__}
if torch.cuda.is_available():
    n, d, v = 4096, 4096, 152064
    h = torch.randn(n, d, device='cuda', dtype=torch.bfloat16)
    w = torch.randn(v, d, device='cuda', dtype=torch.bfloat16)
    def ms(fn, reps=10):
        fn(); torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps): fn()
        b.record(); torch.cuda.synchronize()
        return a.elapsed_time(b) / reps
    t = ms(lambda: h @ w.T)
    src = torch.empty(2**30, dtype=torch.uint8, device='cuda'); dst = torch.empty_like(src)
    c = torch.zeros(n, d, device='cuda')
    g = torch.randn(n, 8192, device='cuda', dtype=torch.bfloat16)
    tb._matmul(g, w[:8192], c, True, 1.0, 'probe')
    out.update(gpu=torch.cuda.get_device_name(0), gemm_shape=[n, d, v], gemm_ms=t, gemm_tflops=2*n*d*v/t/1e9,
               copy_tbs=2 * 2**30 / (ms(lambda: dst.copy_(src)) / 1e3) / 1e12,
               gemm_f32_output_mode=tb.GEMM_F32_MODE['mode'])
print(json.dumps(out))
json.dump(out, open(sys.argv[1], 'w'), indent=1)" "$OUT/gemm_reference.json" >> "$OUT/env.txt" 2>&1

status=0
# step NAME LOG SECONDS cmd...: run cmd under the budget (timed) into LOG; sets NAME_rc and NAME_s (its seconds)
step() { local name=$1 log=$2 limit=$3 t0 rc; shift 3; t0=$(date +%s)
  timed "$limit" "$@" > "$log" 2>&1; rc=$?
  [ "$rc" -ne 0 ] && status=1
  printf -v "${name}_rc" %s "$rc"; printf -v "${name}_s" %s "$(( $(date +%s) - t0 ))"; }

step tests "$OUT/pytest_gpu.log" 150 "$PY" -c "$BOOT
import pytest; sys.exit(pytest.main(sys.argv[1:]))" -m gpu tests -q -rs -p no:cacheprovider \
  --continue-on-collection-errors --ignore=tests/dist/test_fsdp_one_device.py --junitxml="$OUT/pytest_gpu.xml"

# FSDP2 on one GPU: a 1-rank nccl process group in the test process, one SEED and one GRPO update vs the plain one
step fsdp "$OUT/fsdp_1gpu.log" 45 "$PY" -c "$BOOT
import pytest; sys.exit(pytest.main(sys.argv[1:]))" -m gpu tests/dist/test_fsdp_one_device.py -q -rs \
  -p no:cacheprovider

# The RL step at the Qwen2.5-1.5B shape, random init, SEED vs GRPO (tokens/s, MFU, peak memory)
step step "$OUT/step_gpu.log" 100 "$PY" benchmarks/step_gpu.py --shape qwen1.5b --device cuda --dtype bf16 \
  --out "$OUT/step_gpu.json"

step bench "$OUT/kernels.log" 120 "$PY" -c "$BOOT
import runpy; sys.argv = ['benchmarks/kernels.py', '--quick']; runpy.run_path('benchmarks/kernels.py', run_name='__main__')"
cp benchmarks/results/kernels.json benchmarks/results/kernels.png "$OUT/" 2>/dev/null

# peers.py runs each recipe in a child process: the finder above reaches them as a sitecustomize on PYTHONPATH
BOOTDIR=$(mktemp -d)
printf '%s\n' "$BOOT" > "$BOOTDIR/sitecustomize.py"
step peers "$OUT/peers.log" 80 env PYTHONPATH="$BOOTDIR${PYTHONPATH:+:$PYTHONPATH}" "$PY" benchmarks/peers.py \
  --shape qwen1.5b --device cuda --dtype bf16 --out "$OUT/peers_cuda.json"
rm -rf "$BOOTDIR"

{
  echo "pytest -m gpu: exit $tests_rc in ${tests_s}s ($(tail -n 1 "$OUT/pytest_gpu.log"))"
  grep -E "^ERROR .*(collect|import)|^ERROR tests/" "$OUT/pytest_gpu.log" | sed 's/^/  collection: /' || true
  echo "FSDP2 on one GPU (tests/dist/test_fsdp_one_device.py): exit $fsdp_rc in ${fsdp_s}s ($(tail -n 1 "$OUT/fsdp_1gpu.log"))"
  echo "benchmarks/step_gpu.py --shape qwen1.5b: exit $step_rc in ${step_s}s (124 = time limit, 125 = skipped: budget)"
  grep -E "^(grpo|seed) " "$OUT/step_gpu.log" | sed 's/^/  /' || true
  echo "gemm reference: $(tail -n 1 "$OUT/env.txt")"
  echo "benchmarks/kernels.py --quick: exit $bench_rc in ${bench_s}s (124 = time limit, 125 = skipped; kernels.json keeps finished shapes)"
  echo "benchmarks/peers.py --device cuda: exit $peers_rc in ${peers_s}s (124 = time limit, 125 = skipped)"
  echo "total: $(( $(date +%s) - T0 ))s of a ${BUDGET_S}s budget"
} | tee "$OUT/summary.txt"
exit $status
