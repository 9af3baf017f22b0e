#!/usr/bin/env bash
# One short GPU window: the CUDA tests (pytest -m gpu), the kernel microbenchmarks and one RL update side by side
# with the reference recipe (benchmarks/peers.py, Qwen2.5-1.5B shape, bf16), < 11 minutes on one GPU, no network,
# installs nothing.
#
#   benchmarks/gpu_check.sh OUT_DIR          (from anywhere; PYTHON=/path/to/python to pick the interpreter)
#
# Writes OUT_DIR/{env.txt, nvidia-smi.txt, pytest_gpu.xml (JUnit), pytest_gpu.log, kernels.log, kernels.json,
# kernels.png, peers.log, peers_cuda.json, summary.txt}. Exit status: non-zero when a test failed or a step ran past its time limit.
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

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  git rev-parse HEAD 2>/dev/null || true
  py "import torch, triton, seedfast.kernels as k; print('python', sys.version.split()[0]);
print('torch', torch.__version__, 'cuda', torch.version.cuda); print('triton', triton.__version__);
print('gpu', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None); print('kernels', k.__file__)"
} > "$OUT/env.txt" 2>&1
command -v nvidia-smi >/dev/null && nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1

status=0
start=$(date +%s)
timeout 240 "$PY" -c "$BOOT
import pytest; sys.exit(pytest.main(sys.argv[1:]))" -m gpu tests -q -rs -p no:cacheprovider \
  --junitxml="$OUT/pytest_gpu.xml" > "$OUT/pytest_gpu.log" 2>&1
tests_rc=$?
[ $tests_rc -ne 0 ] && status=1
tests_s=$(( $(date +%s) - start ))

start=$(date +%s)
timeout 220 "$PY" -c "$BOOT
import runpy; sys.argv = ['benchmarks/kernels.py']; runpy.run_path('benchmarks/kernels.py', run_name='__main__')" \
  > "$OUT/kernels.log" 2>&1
bench_rc=$?
[ $bench_rc -ne 0 ] && status=1
bench_s=$(( $(date +%s) - start ))
cp benchmarks/results/kernels.json benchmarks/results/kernels.png "$OUT/" 2>/dev/null

# peers.py runs each recipe in a child process: the finder above reaches them as a sitecustomize on PYTHONPATH
start=$(date +%s)
BOOTDIR=$(mktemp -d)
printf '%s\n' "$BOOT" > "$BOOTDIR/sitecustomize.py"
PYTHONPATH="$BOOTDIR${PYTHONPATH:+:$PYTHONPATH}" timeout 180 "$PY" benchmarks/peers.py --shape qwen1.5b \
  --device cuda --dtype bf16 --out "$OUT/peers_cuda.json" > "$OUT/peers.log" 2>&1
peers_rc=$?
[ $peers_rc -ne 0 ] && status=1
peers_s=$(( $(date +%s) - start ))
rm -rf "$BOOTDIR"

{
  echo "pytest -m gpu: exit $tests_rc in ${tests_s}s ($(tail -n 1 "$OUT/pytest_gpu.log"))"
  echo "benchmarks/kernels.py: exit $bench_rc in ${bench_s}s (124 = time limit; kernels.json keeps finished shapes)"
  echo "benchmarks/peers.py --device cuda: exit $peers_rc in ${peers_s}s (124 = time limit)"
} | tee "$OUT/summary.txt"
exit $status
