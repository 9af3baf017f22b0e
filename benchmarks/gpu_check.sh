#!/usr/bin/env bash
# One GPU window, headline numbers first, so that a window cut short still answers the main question:
#   gemm     cuBLAS bf16 GEMMs at the LM-head shapes (N=16384, d=4096, V=152064), measured in this run: the rate every
#            kernel number is judged against (benchmarks/gemm_reference.py)
#   kernels  the LM-head kernels at N=16384 beside that GEMM (benchmarks/kernels.py --n 16384, no torch.compile)
#   tests    the gpu-marked tests of kernels/ and ops/ (one autotune candidate each: SEEDFAST_AUTOTUNE_ONE=1)
#   step     a reduced RL step (Qwen2.5-1.5B width, 8 layers): tokens/s/GPU and MFU (benchmarks/step_gpu.py)
#   rest     the other gpu tests, FSDP2 on one GPU, peers at the Qwen2.5-1.5B shape
# Python is the image's: ${PYTHON:-python3}, with its own torch; nothing is installed (no make, no venv).
#
#   benchmarks/gpu_check.sh OUT_DIR     (PYTHON=..., BUDGET_S=seconds, STEPS="gemm kernels ...", KILL_S=seconds)
#
# The whole script stays inside BUDGET_S (default 570: one 10-minute device command with room to copy back). A step
# runs under `timeout -k KILL_S` for its own limit or what is left of the budget, whichever is smaller (a child that
# ignores SIGTERM is killed KILL_S later); one with under MIN_STEP_S left is skipped (125). STEPS picks and orders
# steps, so a second command can run the rest. Every result is streamed to disk as it comes, in at most 8 files
# directly under OUT_DIR (what a device run brings back):
#   summary.txt          versions, GPU, one line per step as it ends (exit code, seconds, limit), the headlines
#   gemm_reference.json  the cuBLAS reference        kernels.json   the N=16384 kernel rows (rewritten per shape)
#   pytest_gpu.log       -v -rA, one line per test as it finishes   pytest_gpu.xml  JUnit of the whole tests step
#   step_gpu.json        the reduced step            peers_cuda.json               window.log  every step's output
# Exit status: non-zero when a step failed, ran past its limit or was skipped.
set -uo pipefail

OUT=${1:?usage: benchmarks/gpu_check.sh OUT_DIR}
PY=${PYTHON:-python3}
REPO=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$REPO"

export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Nothing is installed: every Python process finds the repository first (children too).
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
BUDGET_S=${BUDGET_S:-570}
MIN_STEP_S=${MIN_STEP_S:-20}
KILL_S=${KILL_S:-10}
STEPS=${STEPS:-gemm kernels tests step rest}
# Each step's own limit on a cold machine (Triton autotune compiles, cuBLAS heuristics, CUDA context):
declare -A OWN=([gemm]=40 [kernels]=120 [tests]=240 [step]=150 [rest]=200)
T0=$(date +%s)
SUMMARY="$OUT/summary.txt"
LOG="$OUT/window.log"
: > "$LOG"
status=0

# limit SECONDS: the step's own limit, or what is left of the budget less the kill grace; 0: skip it
limit() { local left=$(( BUDGET_S - ($(date +%s) - T0) - KILL_S )); [ "$left" -lt "$MIN_STEP_S" ] && { echo 0; return; }
  [ "$1" -lt "$left" ] && echo "$1" || echo "$left"; }

# run_step NAME DESCRIPTION cmd...: cmd under the budget, its output appended to window.log, one summary line
run_step() { local name=$1 what=$2 t t0 rc; shift 2; t=$(limit "${OWN[$name]}"); t0=$(date +%s)
  echo "=== $name: $what (limit ${t}s) $(date -u +%H:%M:%S)" >> "$LOG"
  if [ "$t" -eq 0 ]; then rc=125; else timeout -k "$KILL_S" "$t" "$@" >> "$LOG" 2>&1; rc=$?; fi
  [ "$rc" -ne 0 ] && status=1
  echo "$name: exit $rc in $(( $(date +%s) - t0 ))s (limit ${t}s of own ${OWN[$name]}s; 124/137 = time limit, 125 = skipped: budget) $what" \
    | tee -a "$SUMMARY"; }

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  git rev-parse HEAD 2>/dev/null || true
  echo "python: $PY ($(command -v "$PY" || echo not found))"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit \
    --format=csv,noheader 2>&1
} > "$SUMMARY"

step_gemm() { run_step gemm "cuBLAS bf16 GEMMs at the LM-head shapes" \
  "$PY" benchmarks/gemm_reference.py "$OUT/gemm_reference.json"
  echo "  gemm reference: $(tr -d '\n' < "$OUT/gemm_reference.json" 2>/dev/null | cut -c1-600)" >> "$SUMMARY"; }

step_kernels() { run_step kernels "LM-head kernels at N=16384 (benchmarks/kernels.py)" \
  "$PY" benchmarks/kernels.py --n 16384 --no-compile --reps 3 --out "$OUT/kernels.json" \
  --gemm-ref "$OUT/gemm_reference.json"; }

TEST_FILES="tests/kernels tests/ops"
step_tests() { run_step tests "pytest -m gpu $TEST_FILES (log: pytest_gpu.log)" env SEEDFAST_AUTOTUNE_ONE=1 \
  bash -c "exec '$PY' -m pytest -m gpu $TEST_FILES -v -rA -p no:cacheprovider --continue-on-collection-errors \
  --junitxml='$OUT/pytest_gpu.xml' > '$OUT/pytest_gpu.log' 2>&1"
  echo "  $(tail -n 1 "$OUT/pytest_gpu.log" 2>/dev/null)" >> "$SUMMARY"; }

step_step() { run_step step "reduced RL step, Qwen2.5-1.5B width, 8 layers (benchmarks/step_gpu.py)" \
  "$PY" benchmarks/step_gpu.py --shape qwen1.5b --layers 8 --reps 1 --device cuda --dtype bf16 \
  --out "$OUT/step_gpu.json"
  grep -E "^(grpo|seed) " "$LOG" | sed 's/^/  /' >> "$SUMMARY"; }

step_rest() { run_step rest "other gpu tests, FSDP2 on one GPU, peers" bash -c "
  '$PY' -m pytest -m gpu tests -q -rA -p no:cacheprovider --continue-on-collection-errors \
    --ignore=tests/kernels --ignore=tests/ops --ignore=tests/distributed/test_fsdp_one_device.py; a=\$?
  '$PY' -m pytest -m gpu tests/distributed/test_fsdp_one_device.py -q -rA -p no:cacheprovider; c=\$?
  '$PY' benchmarks/peers.py --shape qwen1.5b --device cuda --dtype bf16 --out '$OUT/peers_cuda.json'; b=\$?
  exit \$(( a || b || c ))"; }

for s in $STEPS; do
  declare -F "step_$s" >/dev/null || { echo "unknown step $s" | tee -a "$SUMMARY"; status=1; continue; }
  "step_$s"
done
echo "total: $(( $(date +%s) - T0 ))s of a ${BUDGET_S}s budget" | tee -a "$SUMMARY"
exit $status
