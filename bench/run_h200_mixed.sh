#!/usr/bin/env bash
# One GPU under mixed load (bench/gpu_mixed.py): closed loops of clients on
# the 1B and the 8B at once, against what the operating curves predict.
# Through the device tool (repo root as cwd; carry .llama .whl .data):
#   JOULEGATE_COMMIT=<hash> bash bench/run_h200_mixed.sh
# <hash>: `git rev-parse --short HEAD` of this checkout, written out (the device's
# git may hold an older commit than the tree it carries: results would name that).
# Setup (bench/device_setup.sh, ~3 min on a fresh machine), then the grid:
# 16 points x 2 prompt lengths at SECONDS (default 6) each, ~5 min; the points
# done are in gpu-mixed.partial.json if the call is cut off.
# PROMPTS=chat-traffic (a workload's prompts, as the replays send them;
# PROMPTS=fixed,chat-traffic both in turn on one set of workers),
# VIA_GATEWAY=1 (through a joulegate gateway), NAME=gpu-loops-... (the file).
set -euo pipefail
LIMIT_S=570 SETUP_MODELS="llama-1b llama-8b"
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
timeout "$(left)" python3 bench/gpu_mixed.py --llama-server /tmp/jg/bin/llama-server \
  --models-dir /tmp/jg/models --out /tmp/jg/res --seconds "${SECONDS_PER_POINT:-6}" \
  ${GRID:+--grid "$GRID"} ${PROMPTS:+--prompts "$PROMPTS"} ${VIA_GATEWAY:+--via-gateway} \
  --name "${NAME:-gpu-mixed}" | tail -40 || echo "cut off: the points done are in the partial file"
cp /tmp/jg/res/"${NAME:-gpu-mixed}"* "$OUT_DIR/" 2>/dev/null || true
echo "done in $(( $(date +%s) - start )) s; results in $OUT_DIR"
