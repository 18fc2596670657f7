#!/usr/bin/env bash
# Run the CUDA tests of the kernel library and of the cooperative @gw.kernel under NVIDIA's compute-sanitizer
# (memcheck, racecheck, synccheck), and tests/kernels/test_sanitizer.py (a racy kernel caught, the persistent kernel clean
# under memcheck). The persistent kernel's own test file is left out: its tests allocate buffers while it runs
# (cudaMallocAsync, since cudaMalloc would wait for it), and memcheck reports its reads of them as out of bounds:
# the kernel was launched before those allocations, so it is not stream-ordered after them.
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
  local summary
  summary=$(grep -Eo '(ERROR SUMMARY: [0-9]+ errors?|RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ errors?)' "$log" | tail -1)
  echo "$1 $(basename "$2"): exit $rc, $summary, $(grep -Eo '[0-9]+ (passed|failed)' "$log" | tr '\n' ' ')"
  [ $rc -eq 0 ] || status=1
}
run memcheck tests/library/test_library.py cuda
run memcheck tests/kernels/test_pykernel_shared.py cuda
run racecheck tests/library/test_library.py cuda
run racecheck tests/kernels/test_pykernel_shared.py cuda
run synccheck tests/library/test_library.py cuda
run synccheck tests/kernels/test_pykernel_shared.py cuda
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_sanitizer.py >"$out/test_sanitizer.txt" 2>&1 || status=1
echo "tests/kernels/test_sanitizer.py: exit $?, $(grep -Eo '[0-9]+ (passed|failed|skipped)' "$out/test_sanitizer.txt" | tr '\n' ' ')"
exit $status
