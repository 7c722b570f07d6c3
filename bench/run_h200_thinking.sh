#!/usr/bin/env bash
# The H200 thinking benchmark (bench/gpu_thinking.py), in as few device calls
# as its limits allow. Through the device tool (repo root as cwd; carry .llama
# .whl .data, prepared by bench/prepare_h200.sh):
#   JOULEGATE_COMMIT=<hash> bash bench/run_h200_thinking.sh
# <hash>: `git rev-parse --short HEAD` of this checkout, written out (the device's
# git may hold an older commit than the tree it carries: results would name that).
# Each call does what is not done yet and stops before the 10-minute limit:
#   1. setup (bench/device_setup.sh): llama-server, the Qwen3-1.7B and -8B shapes;
#   2. calibrate -> gpu-thinking-curves.json (+ curves/h200/qwen3-*.json);
#   3. replay    -> gpu-thinking.json (+ .png), concurrency 1 then 8.
# A phase is done when its result is under /tmp/jg/res on a warm machine (or
# in bench/results/, with curves/h200/ holding the curves). Results go to $OUT.
# FORCE="replay" (or "calibrate replay") runs those phases again even so.
set -euo pipefail
force="${FORCE:-}"
LIMIT_S=570 SETUP_MODELS="qwen3-1.7b qwen3-8b"
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
mkdir -p /tmp/jg/curves
for phase in calibrate replay; do
  f=gpu-thinking.json; [ "$phase" = calibrate ] && f=gpu-thinking-curves.json
  if [[ " $force " == *" $phase "* ]]; then
    rm -f "/tmp/jg/res/$f"; continue  # asked for again: what is there does not count
  fi
  [ -f "bench/results/$f" ] && [ ! -f "/tmp/jg/res/$f" ] && cp "bench/results/$f" /tmp/jg/res/
done
cp -n curves/h200/qwen3-*.json /tmp/jg/curves/ 2>/dev/null || true
args=(--llama-server /tmp/jg/bin/llama-server --models-dir /tmp/jg/models --out /tmp/jg/res
      --curves-dir /tmp/jg/curves)
if [ ! -f /tmp/jg/res/gpu-thinking-curves.json ]; then
  if [ "$(left)" -lt 200 ]; then echo "calibrate needs ~3 min: call again"; exit 0; fi
  timeout "$(left)" python3 bench/gpu_thinking.py --phase calibrate "${args[@]}" | tail -3
  mkdir -p "$OUT_DIR/curves" && cp /tmp/jg/curves/qwen3-*.json "$OUT_DIR/curves/"
  cp /tmp/jg/res/gpu-thinking-curves.* "$OUT_DIR/"
fi
if [ ! -f /tmp/jg/res/gpu-thinking.json ]; then
  if [ "$(left)" -lt 420 ]; then echo "replay needs ~7 min: call again"; exit 0; fi
  timeout "$(left)" python3 bench/gpu_thinking.py --phase replay "${args[@]}" \
    --n1 "${N1:-40}" --n8 "${N8:-64}" | tail -5
  cp /tmp/jg/res/gpu-thinking.* "$OUT_DIR/"
fi
echo "done in $(( $(date +%s) - start )) s; results in $OUT_DIR"
