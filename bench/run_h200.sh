#!/usr/bin/env bash
# The H200 benchmark, whole, in as few device calls as its limits allow.
#
# Through the device tool (repo root as cwd; carry .llama .whl .data):
#   JOULEGATE_COMMIT=<hash> bash bench/run_h200.sh
# <hash>: `git rev-parse --short HEAD` of this checkout, written out (the device's
# git may hold an older commit than the tree it carries: results would name that).
# Each call does what is not done yet and stops before the 10-minute limit:
#   1. setup (bench/device_setup.sh): llama-server (carried build or 5-min CUDA
#      build), the 1B and 8B random-weight models, the wheels;
#   2. calibrate -> gpu-curves.json (+ curves/*.json, gpu-curves.png);
#   3. replay    -> gpu-routing-<workload>.json (+ .png), chat-traffic then
#                   benchmark-mix (WORKLOADS="..." to choose);
#   4. telemetry -> gpu-telemetry.json (attribution by the 1B's fresh curve).
# A phase is done when its result is in bench/results/ (copy back what $OUT
# returned, commit, call again) or already under /tmp/jg/res on a warm machine.
# Results are copied to $OUT, which the device tool brings back.
# CONCURRENCY=8 replays the c=8 turns alone (gpu-routing-<workload>-c8.json);
# CONCURRENCY=2 (or 4, or 2,4) moderate overlapping load (-c2.json ...), not in
# the whole replay. SPLIT=1 (with CONCURRENCY=...): always-large, auto, a
# load-blind split and auto-share in turns (-cN-split.json).
# CAL_CONCURRENCY=1,2,4,8 (with PHASES=calibrate): curves with a batch profile.
# ANSWERS=varied: each request's answer length drawn (same mean; -varied.json).
# CURVES=h100: the routers price with curves/h100/ (default curves/h200/).
# PHASES="telemetry" (any of calibrate replay telemetry) re-runs just those,
# even where bench/results/ already holds their file, and writes only the
# models they need (the 8B only for calibrate and replay).
set -euo pipefail
phases="${PHASES:-}"
models="llama-1b llama-8b"
if [ -n "$phases" ] && [[ " $phases " != *" calibrate "* && " $phases " != *" replay "* ]]; then
  models="llama-1b"
fi
LIMIT_S="${LIMIT_S:-560}" SETUP_MODELS="$models"  # LIMIT_S: less where the call did other work first
# shellcheck source=bench/device_prelude.sh
. bench/device_prelude.sh
for phase in calibrate replay telemetry; do
  f="gpu-$phase.json"; [ "$phase" = calibrate ] && f=gpu-curves.json
  [ "$phase" = replay ] && f=gpu-routing.json
  if [ -n "$phases" ] && [[ " $phases " != *" $phase "* ]]; then
    touch "/tmp/jg/res/$f.skip"; continue  # not asked for this time
  fi
  [ -n "$phases" ] && continue  # asked for: measure it again
  for g in "bench/results/$f" bench/results/gpu-routing-*.json; do
    [ "$phase" = replay ] || [ "$g" = "bench/results/$f" ] || continue
    [ -f "$g" ] && [ ! -f "/tmp/jg/res/$(basename "$g")" ] && cp "$g" /tmp/jg/res/
  done
done
# CURVES=h100: price with curves/h100/ (one H100's, with a batch profile) instead of
# curves/h200/ (a warm machine keeps the curves it has; a replay's result names them)
curves="curves/${CURVES:-h200}"
[ -d "$curves" ] && mkdir -p /tmp/jg/curves && cp -n "$curves"/*.json /tmp/jg/curves/ 2>/dev/null || true
run() {  # a phase, and any further arguments for it
  timeout "$(left)" python3 bench/gpu_routing.py --phase "$@" --llama-server /tmp/jg/bin/llama-server \
    --models-dir /tmp/jg/models --out /tmp/jg/res --curves-dir /tmp/jg/curves | tail -5
}
if [ ! -f /tmp/jg/res/gpu-curves.json ] && [ ! -f /tmp/jg/res/gpu-curves.json.skip ]; then
  # CAL_CONCURRENCY=1,2,4,8: the curves' batch profile too (router/curves.py;
  # twice the points of the default 1,8)
  run calibrate ${CAL_CONCURRENCY:+--concurrency "$CAL_CONCURRENCY"}
  mkdir -p "$OUT_DIR/curves" && cp /tmp/jg/curves/*.json "$OUT_DIR/curves/"
  cp /tmp/jg/res/gpu-curves.* "$OUT_DIR/"
fi
concurrency="${CONCURRENCY:-1,8}"  # CONCURRENCY=8: the c=8 turns alone (~2.5 min a workload)
part=""; [ "$concurrency" = "1,8" ] || part="-c${concurrency//,/-c}"
# SPLIT=1: turns of always-large, auto, `split` (each prompt to its unloaded
# action, blind to load) and auto-share (the share pricing, router.pricing)
# (-split.json; seven turns: at c=4 ~35 s a turn of 100 prompts; N=100 sets the
# prompts, the whole 200 need a warm machine's call)
split=""; [ -n "${SPLIT:-}" ] && { split="--split"; part="${part:--c${concurrency//,/-c}}-split"; }
# SECOND=margin, prompt, pairs or fulltol (with SPLIT=1): the second gateway's load
# pricing (router.pricing) instead of share
[ -n "$split" ] && [ -n "${SECOND:-}" ] && split="--split --second $SECOND"
# PROFILE_FROM=bench/results/gpu-loops-...json: auto's 8B curve with the batch
# profile those closed loops measured, the second gateway's without (-profile.json)
[ -n "${PROFILE_FROM:-}" ] && { split="$split --profile-from $PROFILE_FROM"; part="$part-profile"; }
# ANSWERS=varied: answer lengths drawn per request, same mean (-varied.json)
answers=""; [ "${ANSWERS:-fixed}" = varied ] && { answers="--answers varied"; part="$part-varied"; }
need=360; [ "$concurrency" = 8 ] && need=180
# c=2 and c=4 (estimates from the c=8 turns' ~12 s each: not measured yet):
# ~4-5 min and ~2-3 min a workload; one call each is safer than CONCURRENCY=2,4
[ "$concurrency" = 2 ] && need=330
[ "$concurrency" = 4 ] && need=210
[ "$concurrency" = "2,4" ] && need=480
[ -n "$split" ] && need=$(( ${N:-200} * 27 / 10 ))
for workload in ${WORKLOADS:-chat-traffic benchmark-mix}; do
  f="gpu-routing-$workload$part.json"
  [ -f /tmp/jg/res/gpu-routing.json.skip ] && break
  [ -f "/tmp/jg/res/$f" ] && continue
  if [ "$(left)" -lt "$need" ]; then echo "replay of $workload needs ~$((need / 60)) min: call again"; exit 0; fi
  # cut off by the time left: its finished turns are in the .partial.json
  timeout "$(left)" python3 bench/gpu_routing.py --phase replay --workload "$workload" \
    --concurrency "$concurrency" $split $answers --n "${N:-200}" \
    --llama-server /tmp/jg/bin/llama-server --models-dir /tmp/jg/models --out /tmp/jg/res \
    --curves-dir /tmp/jg/curves | tail -5 || echo "replay of $workload stopped: partial turns kept"
  # (a replay stopped before its first turn ended has no file)
  cp /tmp/jg/res/gpu-routing-"$workload$part".* "$OUT_DIR/" 2>/dev/null || true
done
if [ ! -f /tmp/jg/res/gpu-telemetry.json ] && [ ! -f /tmp/jg/res/gpu-telemetry.json.skip ]; then
  if [ "$(left)" -lt 200 ]; then echo "telemetry needs ~3 min: call again"; exit 0; fi
  timeout "$(left)" python3 bench/gpu_telemetry.py --llama-server /tmp/jg/bin/llama-server \
    --model /tmp/jg/models/llama-1b.gguf --curve /tmp/jg/curves/llama-1b.json \
    --out /tmp/jg/res | tail -3
  cp /tmp/jg/res/gpu-telemetry.json "$OUT_DIR/"
fi
echo "done in $(( $(date +%s) - start )) s; results in $OUT_DIR"
