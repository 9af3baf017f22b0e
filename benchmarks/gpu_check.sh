#!/usr/bin/env bash
# One GPU window, headline numbers first, so that a window cut short still answers the main question:
#   gemm     cuBLAS bf16 GEMMs at the shapes the kernel model prices (benchmarks/gemm_reference.py): the whole-shape
#            GEMMs, the single pass's per-block GEMMs (fp32 out, fp32 C with beta = 1), the two-pass chunk GEMMs,
#            the row pass over fp32 logits and a device copy; the rates every kernel number is judged against
#   kernels  the LM-head kernels at N=16384, d=4096, V=152064 beside that GEMM (benchmarks/kernels.py, one autotune
#            candidate, no torch.compile): time, max error against fp64, the path each call took
#   divergence  the student-teacher divergence kernels (every kind, forward and forward + backward) at Qwen2.5-0.5B's
#            head, N=4096 d=896 V=151936, beside a cuBLAS GEMM of the shape (benchmarks/kernels.py --divergence)
#   tests    the gpu tests of kernels/ and ops/, every autotune candidate launched against fp64 references included:
#            each file in its own process (one crash costs one file), a per-test timeout, JUnit
#   fsdp     FSDP2 on one GPU (tests/distributed/test_fsdp_one_device.py)
#   step     a reduced RL step (Qwen2.5-1.5B width, 8 layers, sdpa attention, one autotune candidate)
#   rest     the other gpu tests, one process per file
# Python is the image's: ${PYTHON:-python3}, with its own torch; nothing is installed (no make, no venv).
#
#   benchmarks/gpu_check.sh [--dry-run] [--commit SHA] OUT_DIR
#       env: PYTHON, COMMIT (or SEEDFAST_COMMIT), STEPS="gemm kernels ...", LIMITS="step=60 ...", BUDGET_S, KILL_S,
#            MIN_STEP_S, DEVICE_S, START_S, TRANSFER_S
#
# Sizing: a task gets DEVICE_S = 900 s of device time, machine start included (START_S = 240 s assumed: "minutes"), and
# the window must hold one run and one rerun (RUNS = 2), each with TRANSFER_S = 30 s of copying, so one run gets
# BUDGET_S = (900 - 240 - 2 x 30) / 2 = 300 s. --dry-run prints the plan, each step's limit, their sum and the
# window's arithmetic, and refuses (exit 2) a plan whose limits add up to more than BUDGET_S or a BUDGET_S that does
# not fit the window; it runs nothing and needs no GPU. A step runs under `timeout -k KILL_S` for its own limit or what
# is left of the budget, whichever is smaller; one with under MIN_STEP_S left is skipped (125). STEPS picks and orders
# steps: the rerun takes the ones that failed. The commit measured comes in (--commit or $COMMIT: the device's copy of
# the tree may have no .git); without it, git's, else "unknown". Every result is written as it comes, in at most 8
# files directly under OUT_DIR (what a device run brings back):
#   summary.txt   versions, GPU, commit, one line per step as it ends (exit code, seconds, limit), the headlines
#   window.log    every step's output               gemm_reference.json   rewritten after each measurement
#   kernels.json  rewritten after each row           step_gpu.json         rewritten after each algorithm
#   divergence.json  rewritten after each row
#   pytest_gpu.log  -v -rA of every test file, one line per test as it finishes
#   pytest_gpu.xml  JUnit of every test file so far (merged after each file)
# Exit status: non-zero when a step failed, ran past its limit or was skipped; 2 for a refused plan.
set -uo pipefail

DRY=0 COMMIT=${COMMIT:-${SEEDFAST_COMMIT:-}} OUT=
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --commit) COMMIT=${2:?--commit needs a SHA}; shift ;;
    --commit=*) COMMIT=${1#--commit=} ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) OUT=$1 ;;
  esac
  shift
done
[ -n "$OUT" ] || [ "$DRY" = 1 ] || { echo "usage: benchmarks/gpu_check.sh [--dry-run] [--commit SHA] OUT_DIR" >&2; exit 2; }
PY=${PYTHON:-python3}
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"

DEVICE_S=${DEVICE_S:-900}
START_S=${START_S:-240}
TRANSFER_S=${TRANSFER_S:-30}
RUNS=2
BUDGET_S=${BUDGET_S:-$(( (DEVICE_S - START_S - RUNS * TRANSFER_S) / RUNS ))}
MIN_STEP_S=${MIN_STEP_S:-15}
KILL_S=${KILL_S:-5}
STEPS=${STEPS:-gemm kernels divergence tests fsdp step rest}
# Each step's own limit on a cold machine (CUDA context, cuBLAS heuristics, Triton compiles of one candidate each;
# the tests step compiles every candidate once at small shapes). The divergence step (#45) took its 25 s from kernels (5),
# tests (10), fsdp, step and rest (5 each): estimates, none of them measured yet.
declare -A OWN=([gemm]=25 [kernels]=50 [divergence]=25 [tests]=90 [fsdp]=15 [step]=40 [rest]=20)
for kv in ${LIMITS:-}; do OWN[${kv%%=*}]=${kv#*=}; done  # LIMITS="step=60 ...": other limits (the plan still checks)
declare -A WHAT=(
  [gemm]="cuBLAS GEMMs at the model's shapes, row pass, copy -> gemm_reference.json"
  [kernels]="LM-head kernels at N=16384 d=4096 V=152064 -> kernels.json"
  [divergence]="divergence kernels at N=4096 d=896 V=151936 -> divergence.json"
  [tests]="gpu tests of tests/kernels tests/ops, one process per file -> pytest_gpu.log/.xml"
  [fsdp]="FSDP2 on one GPU -> pytest_gpu.log/.xml"
  [step]="reduced RL step, Qwen2.5-1.5B width, 8 layers, sdpa -> step_gpu.json"
  [rest]="the other gpu tests, one process per file -> pytest_gpu.log/.xml")
OUTPUTS="summary.txt window.log gemm_reference.json kernels.json divergence.json pytest_gpu.log pytest_gpu.xml step_gpu.json"

plan() {  # prints the plan; returns 2 when it does not fit
  local total=0 n=0 s ok=0
  echo "plan: ${STEPS} (python: $PY, commit: ${COMMIT:-from git, else unknown})"
  for s in $STEPS; do
    [ -n "${OWN[$s]:-}" ] || { echo "  unknown step $s"; ok=2; continue; }
    printf '  %-8s limit %4ss  %s\n' "$s" "${OWN[$s]}" "${WHAT[$s]}"
    total=$(( total + OWN[$s] + KILL_S )); n=$(( n + 1 ))
  done
  local window=$(( START_S + RUNS * (BUDGET_S + TRANSFER_S) ))
  echo "sum of step limits: ${total}s (${n} steps, each with ${KILL_S}s of kill grace) of a ${BUDGET_S}s budget per run"
  echo "window: start ${START_S}s + ${RUNS} runs x (${BUDGET_S}s + ${TRANSFER_S}s transfer) = ${window}s of ${DEVICE_S}s device time"
  echo "outputs ($(echo $OUTPUTS | wc -w), at most 8): $OUTPUTS"
  if [ "$total" -gt "$BUDGET_S" ]; then echo "REFUSED: step limits add up to ${total}s > budget ${BUDGET_S}s"; ok=2; fi
  if [ "$window" -gt "$DEVICE_S" ]; then echo "REFUSED: a run and a rerun need ${window}s > ${DEVICE_S}s"; ok=2; fi
  [ "$(echo $OUTPUTS | wc -w)" -le 8 ] || { echo "REFUSED: more than 8 outputs"; ok=2; }
  [ "$ok" = 0 ] && echo "plan fits"
  return $ok
}

if [ "$DRY" = 1 ]; then plan; exit $?; fi
plan > /dev/null || { plan; exit 2; }

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Nothing is installed: every Python process finds the repository first (children too).
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
export SEEDFAST_COMMIT=$COMMIT
JUNIT_DIR=$(mktemp -d)  # one JUnit file per test file, merged into OUT/pytest_gpu.xml (not more files under OUT)
trap 'rm -rf "$JUNIT_DIR"' EXIT
T0=$(date +%s)
SUMMARY="$OUT/summary.txt"
LOG="$OUT/window.log"
TESTLOG="$OUT/pytest_gpu.log"
: > "$LOG"
: > "$TESTLOG"
status=0

# limit SECONDS: the step's own limit, or what is left of the budget less the kill grace; 0: skip it
limit() { local left=$(( BUDGET_S - ($(date +%s) - T0) - KILL_S )); [ "$left" -lt "$MIN_STEP_S" ] && { echo 0; return; }
  [ "$1" -lt "$left" ] && echo "$1" || echo "$left"; }

# run_step NAME cmd...: cmd under the step's limit, its output appended to window.log, one summary line
run_step() { local name=$1 t t0 rc; shift; t=$(limit "${OWN[$name]}"); t0=$(date +%s)
  echo "=== $name: ${WHAT[$name]} (limit ${t}s) $(date -u +%H:%M:%S)" >> "$LOG"
  if [ "$t" -eq 0 ]; then rc=125; else STEP_END=$(( t0 + t )) timeout -k "$KILL_S" "$t" "$@" >> "$LOG" 2>&1; rc=$?; fi
  [ "$rc" -ne 0 ] && status=1
  echo "$name: exit $rc in $(( $(date +%s) - t0 ))s (limit ${t}s of own ${OWN[$name]}s; 124/137 = time limit, 125 = skipped: budget) ${WHAT[$name]}" \
    | tee -a "$SUMMARY"; }

# Per-test timeout where the image has pytest-timeout (it does: KINDS.md lists it); the file's own limit regardless.
TIMEOUT_ARG=
"$PY" -c "import pytest_timeout" 2>/dev/null && TIMEOUT_ARG="--timeout=60"
export PY OUT TESTLOG JUNIT_DIR TIMEOUT_ARG KILL_S

# pytest_files FILE...: each file in its own pytest process (-m gpu), inside what is left of the step (STEP_END);
# JUnit merged into OUT/pytest_gpu.xml after each file. Exit 1 if any file failed or was cut.
pytest_files() { local f rc=0 left i=0
  for f in "$@"; do
    i=$(( i + 1 )); left=$(( STEP_END - $(date +%s) - KILL_S ))
    if [ "$left" -lt 5 ]; then echo "SKIPPED (step time) $f" >> "$TESTLOG"; rc=1; continue; fi
    echo "### $f (limit ${left}s) $(date -u +%H:%M:%S)" >> "$TESTLOG"
    timeout -k "$KILL_S" "$left" "$PY" -m pytest -m gpu "$f" -v -rA -p no:cacheprovider $TIMEOUT_ARG \
      --junitxml="$JUNIT_DIR/$(printf '%03d' $i)_$(basename "$f" .py).xml" >> "$TESTLOG" 2>&1
    local frc=$?  # 5: no gpu test selected in the file
    case $frc in 0|5) ;; *) rc=1; echo "FAILED FILE $f (exit $frc; 124/137 = time limit)" >> "$TESTLOG" ;; esac
    "$PY" - "$JUNIT_DIR" "$OUT/pytest_gpu.xml" <<'MERGE'
import sys, pathlib, xml.etree.ElementTree as ET
root = ET.Element("testsuites")
for p in sorted(pathlib.Path(sys.argv[1]).glob("*.xml")):
    try:
        root.extend(ET.parse(p).getroot().iter("testsuite"))
    except ET.ParseError:
        ET.SubElement(root, "testsuite", name=p.name, errors="1")
tmp = pathlib.Path(sys.argv[2] + ".tmp")
ET.ElementTree(root).write(tmp)
tmp.replace(sys.argv[2])
MERGE
  done
  return $rc; }
export -f pytest_files

# gpu test files: those that use the gpu marker (directly or through triton_reference.GPU)
gpu_files() { grep -lE "mark\.gpu|pytestmark = GPU|marks=GPU" $(find "$@" -name 'test_*.py' | sort) 2>/dev/null; }
# the divergence candidates last: newest, and the most compiles per file (three kinds per candidate)
KERNEL_FILES=$(gpu_files tests/kernels tests/ops | grep -v divergence; gpu_files tests/kernels tests/ops | grep divergence)
FSDP_FILE=tests/distributed/test_fsdp_one_device.py
# not tests/rollout and tests/vllm_real: their gpu tests need vLLM, which the image does not have
REST_FILES=$(gpu_files tests | grep -vE "^tests/(kernels|ops|vllm_real|rollout)/|^$FSDP_FILE$")

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  echo "commit: $COMMIT"
  echo "python: $PY ($(command -v "$PY" || echo not found))"
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1 | tail -1
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit \
    --format=csv,noheader 2>&1
  plan | sed 's/^/  /'
} > "$SUMMARY"

step_gemm() { run_step gemm "$PY" -m benchmarks.gemm_reference "$OUT/gemm_reference.json"
  echo "  gemm reference: $(tr -d '\n' < "$OUT/gemm_reference.json" 2>/dev/null | cut -c1-900)" >> "$SUMMARY"; }

step_kernels() { run_step kernels env SEEDFAST_AUTOTUNE_ONE=1 "$PY" -m benchmarks.kernels --n 16384 --d 4096 \
  --v 152064 --no-compile --reps 3 --out "$OUT/kernels.json" --gemm-ref "$OUT/gemm_reference.json"; }

step_divergence() { run_step divergence env SEEDFAST_AUTOTUNE_ONE=1 "$PY" -m benchmarks.kernels --divergence \
  --n 4096 --d 896 --v 151936 --no-compile --reps 3 --out "$OUT/divergence.json" --gemm-ref "$OUT/gemm_reference.json"; }

step_tests() { run_step tests env SEEDFAST_AUTOTUNE_ONE=1 bash -c 'pytest_files "$@"' _ $KERNEL_FILES
  echo "  tests: $(grep -cE ' PASSED' "$TESTLOG") passed, $(grep -cE ' (FAILED|ERROR)' "$TESTLOG") failed/error so far" \
    >> "$SUMMARY"; }

step_fsdp() { run_step fsdp bash -c 'pytest_files "$@"' _ $FSDP_FILE; }

step_step() { run_step step env SEEDFAST_AUTOTUNE_ONE=1 "$PY" -m benchmarks.step_gpu --shape qwen1.5b --layers 8 \
  --reps 1 --device cuda --dtype bf16 --attn sdpa --commit "$COMMIT" --out "$OUT/step_gpu.json"
  grep -E "^(grpo|seed) " "$LOG" | sed 's/^/  /' >> "$SUMMARY"; }

step_rest() { run_step rest env SEEDFAST_AUTOTUNE_ONE=1 bash -c 'pytest_files "$@"' _ $REST_FILES
  echo "  tests: $(grep -cE ' PASSED' "$TESTLOG") passed, $(grep -cE ' (FAILED|ERROR)' "$TESTLOG") failed/error in all" \
    >> "$SUMMARY"; }

for s in $STEPS; do "step_$s"; done
echo "total: $(( $(date +%s) - T0 ))s of a ${BUDGET_S}s budget" | tee -a "$SUMMARY"
exit $status
