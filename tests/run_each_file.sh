#!/usr/bin/env bash
# Every test file on its own, one pytest process each, so a file that passes only after another (an import of a
# test module, a fixture or state left behind) fails here; `make test` runs them all in one session and cannot
# see that. tests/test_tests_are_self_contained.py catches the import kind statically, in every run.
#   tests/run_each_file.sh [pytest args...]        e.g. tests/run_each_file.sh -m "not slow"
# JOBS=n runs n files at once (default 1: many files spawn processes of their own); FILES="a.py b.py" runs those
# files only. Exit status 1 if any file failed; each file's output is in $LOGS (default a temporary folder).
set -uo pipefail
cd "$(dirname "$0")/.."
export PY=${PY:-.venv/bin/python} LOGS=${LOGS:-$(mktemp -d)}
JOBS=${JOBS:-1}
one() {
  local file=$1 log start=$SECONDS rc=0
  shift
  log="$LOGS/$(echo "$file" | tr / _).log"
  OMP_NUM_THREADS=1 timeout 900 "$PY" -m pytest -q -x -p no:cacheprovider "$file" "$@" >"$log" 2>&1 || rc=$?
  case $rc in
    0) echo "ok   $(( SECONDS - start ))s $file" ;;
    5) echo "none $file (no test selected)" ;;
    *) echo "FAIL $(( SECONDS - start ))s $file (exit $rc: $log)" ;;
  esac
}
export -f one
files=${FILES:-$(find tests -name 'test_*.py' | sort)}
printf '%s\n' $files | xargs -P "$JOBS" -I{} bash -c 'one "$@"' _ {} "$@" | tee "$LOGS/summary.txt"
! grep -q '^FAIL' "$LOGS/summary.txt"
