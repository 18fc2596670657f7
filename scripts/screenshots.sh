#!/usr/bin/env bash
# Regenerates the README's screenshots from a real JupyterLab in headless Chromium (the browser end-to-end tests,
# run with GPUWB_E2E_SHOTS): a %%gpu cell's output (source view above its timeline), the source view with a line tapped,
# the trace's statistics, the live dashboard mid-loop, and the side panel (light and dark).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
GPUWB_E2E_SHOTS="$PWD/docs/img" ./run test tests/viz/test_live_e2e.py tests/notebook/test_lab_e2e.py -q
ls -l docs/img
