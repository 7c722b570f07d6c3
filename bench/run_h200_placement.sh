#!/usr/bin/env bash
# Packed vs spread on the H200 (issue 32, item 3; bench/placement.py): two
# replicas of the 8B shape on the one GPU, bursts at concurrency 8 and 16.
# Through the device tool (repo root as cwd; carry .llama .whl .data,
# prepared by bench/prepare_h200.sh):
#   JOULEGATE_COMMIT=$(git rev-parse --short HEAD) bash bench/run_h200_placement.sh
# One call: setup (llama-server, the 8B shape) then the runs (~5 min); the
# result (placement-nvml.json, .png) goes to $OUT.
set -euo pipefail
export PYTHONUNBUFFERED=1
start=$(date +%s)
OUT_DIR="${OUT:-/tmp/jg/out}"
mkdir -p "$OUT_DIR" /tmp/jg/res
OUT= MODELS="llama-8b" bash bench/device_setup.sh > /tmp/jg-setup.log 2>&1 \
  || { tail -30 /tmp/jg-setup.log; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
timeout $(( 580 - ($(date +%s) - start) )) python3 -m bench.placement \
  --llama-server /tmp/jg/bin/llama-server --model /tmp/jg/models/llama-8b.gguf \
  --curve curves/h200/llama-8b.json --source nvml --requests "${REQUESTS:-64}" \
  --tokens "${TOKENS:-256}" --out /tmp/jg/res | tail -5
cp /tmp/jg/res/placement-nvml.* "$OUT_DIR/"
echo "done in $(( $(date +%s) - start )) s; results in $OUT_DIR"
