#!/usr/bin/env bash
# Run the CUDA tests of the kernel library, the cooperative @gw.kernel and the persistent kernel under NVIDIA's
# compute-sanitizer: memcheck over all three, racecheck and synccheck over the shared-memory ones.
# Usage (GPU machine): scripts/sanitize.sh [OUTDIR]   — one report per tool and file in OUTDIR (default sanitize-out).
set -u
cd "$(dirname "$0")/.."
out=${1:-sanitize-out}
mkdir -p "$out"
cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
[ -n "$cs" ] || { echo "compute-sanitizer not found (it ships with the CUDA toolkit)"; exit 2; }
status=0
run() {  # tool, test file, -k expression
  local log="$out/$1-$(basename "$2" .py).txt"
  "$cs" --tool "$1" --error-exitcode 9 --print-limit 20 \
    python3 -m pytest -q -p no:cacheprovider -x "$2" -k "$3" -m gpu >"$log" 2>&1
  local rc=$?
  echo "$1 $(basename "$2"): exit $rc, $(grep -Eo 'ERROR SUMMARY: [0-9]+ errors?' "$log" | tail -1), $(grep -Eo '[0-9]+ passed' "$log" | tail -1)"
  [ $rc -eq 0 ] || status=1
}
run memcheck tests/test_library.py cuda
run memcheck tests/test_pykernel_shared.py cuda
run memcheck tests/test_persistent.py cuda
run racecheck tests/test_library.py cuda
run racecheck tests/test_pykernel_shared.py cuda
run synccheck tests/test_library.py cuda
run synccheck tests/test_pykernel_shared.py cuda
exit $status
