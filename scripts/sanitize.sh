#!/usr/bin/env bash
# Run every test file that has CUDA tests (those marked gpu) under NVIDIA's compute-sanitizer: memcheck, racecheck and
# synccheck, one process per tool and file, JOBS at a time (default 6; the tools slow kernels 10-100x, so they share
# the GPU well). Then tests/kernels/test_sanitizer.py (a racy kernel caught, the persistent kernel clean).
# Left out, and counted: tests marked cupti (CUPTI cannot attach beside the sanitizer, a CUPTI client itself) and
# concurrent (two kernels that must run at once, as two persistent kernels: the tools run kernels one at a time).
# Not counted as errors: CUDA API calls that return an error (the out-of-memory tests provoke them on purpose);
# every memory access error, race hazard and barrier error is.
# Usage (GPU machine): scripts/sanitize.sh [OUTDIR] [FILE ...]  — one report per tool and file in OUTDIR (default
# sanitize-out), a line per report on stdout, and OUTDIR/summary.txt; exit 1 if any report has an error or hazard.
set -u
cd "$(dirname "$0")/.."
out=${1:-sanitize-out}
shift || true
mkdir -p "$out"
cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
[ -n "$cs" ] || { echo "compute-sanitizer not found (it ships with the CUDA toolkit)"; exit 2; }
if [ $# -gt 0 ]; then
  files=("$@")
else  # every file with a test marked gpu, but the sanitizer's own (it starts the tool itself)
  mapfile -t files < <(python3 -m pytest -q -p no:cacheprovider --collect-only -m "gpu and not cupti and not concurrent" tests 2>/dev/null |
    grep -Eo '^tests/[^:]+\.py' | sort -u | grep -v 'tests/kernels/test_sanitizer.py')
fi
echo "${#files[@]} files: ${files[*]}"
echo "left out (marked cupti or concurrent): $(python3 -m pytest -q -p no:cacheprovider --collect-only \
  -m "gpu and (cupti or concurrent)" tests \
  2>/dev/null | grep -c '::') tests"

one() {  # tool, test file: one line "tool file: exit, summary, counts"
  local log="$out/$1-$(echo "$2" | tr '/' '_' | sed 's/\.py$//').txt"
  local began=$SECONDS
  "$cs" --tool "$1" --error-exitcode 9 --print-limit 20 --target-processes all --report-api-errors no \
    python3 -m pytest -q -p no:cacheprovider "$2" -m "gpu and not cupti and not concurrent" >"$log" 2>&1
  local rc=$?
  local summary
  summary=$(grep -Eo '(ERROR SUMMARY: [0-9]+ errors?|RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ errors?)' \
    "$log" | tail -1)
  echo "$1 $2: exit $rc, ${summary:-no summary}, $(grep -Eo '[0-9]+ (passed|failed|skipped|errors?)' "$log" |
    tr '\n' ' ')in $((SECONDS - began)) s"
}
export -f one
export cs out
for f in "${files[@]}"; do for tool in memcheck racecheck synccheck; do echo "$tool $f"; done; done |
  xargs -P "${JOBS:-6}" -L 1 bash -c 'one "$0" "$1"' | tee "$out/summary.txt"
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_sanitizer.py >"$out/test_sanitizer.txt" 2>&1
rc=$?
echo "tests/kernels/test_sanitizer.py: exit $rc, $(grep -Eo '[0-9]+ (passed|failed|skipped)' "$out/test_sanitizer.txt" |
  tr '\n' ' ')" | tee -a "$out/summary.txt"
if [ $rc -ne 0 ] || grep -vE 'exit 0, (ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards)' "$out/summary.txt" |
  grep -q '^[a-z]*check '; then
  exit 1
fi
