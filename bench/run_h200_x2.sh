#!/usr/bin/env bash
# Two GPUs (issue 32, item 4; the device tool's `nvidia-h200-x2` kind): the
# models on separate GPUs and two 8B replicas on two GPUs (bench/gpu_two.py),
# resumable over calls on a warm machine, each layout ~5 min after setup.
# Carry .whl .llama .data (bench/prepare_h200.sh) and run:
#   JOULEGATE_COMMIT=<hash> bash bench/run_h200_x2.sh
# -> gpu-two-split.json, gpu-two-two-large.json (+ .png) in $OUT.
set -euo pipefail
export PYTHONUNBUFFERED=1 JOULEGATE_DATA="${JOULEGATE_DATA:-$PWD/.data}"
start=$(date +%s)
left() { echo $(( 575 - ($(date +%s) - start) )); }
OUT_DIR="${OUT:-/tmp/jg/out}"
W=/tmp/jg
mkdir -p "$OUT_DIR" "$W/res" "$W/curves"
cp -n curves/h200/llama-*.json "$W/curves/" 2>/dev/null || true
if [ ! -x "$W/bin/llama-server" ] || [ ! -f "$W/models/llama-8b.gguf" ]; then
  OUT="$OUT_DIR" MODELS="llama-1b llama-8b" bash bench/device_setup.sh > /tmp/jg-setup.log 2>&1 \
    || { tail -30 /tmp/jg-setup.log; exit 1; }
fi
export PYTHONPATH=/tmp/site:$PWD
for layout in ${LAYOUTS:-split two-large}; do
  [ -f "$W/res/gpu-two-$layout.json" ] && continue
  if [ "$(left)" -lt 330 ]; then echo "layout $layout needs ~5.5 min: call again"; exit 0; fi
  timeout "$(left)" python3 -m bench.gpu_two --layout "$layout" \
    --llama-server "$W/bin/llama-server" --models-dir "$W/models" --curves-dir "$W/curves" \
    --out "$W/res" | tail -4
  cp "$W/res/gpu-two-$layout".* "$OUT_DIR/"
done
echo "done in $(( $(date +%s) - start )) s; results in $OUT_DIR"
