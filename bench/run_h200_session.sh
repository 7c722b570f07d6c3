#!/usr/bin/env bash
# One device session's H200 work, whole, resumable over several calls on a
# warm machine: each call does the jobs not done yet that fit before the
# 10-minute limit, in this order, and copies their results to $OUT.
#   setup      bench/device_setup.sh: llama-server (built, packed to $OUT for
#              later sessions), the 1B and 8B random-weight shapes
#   placement  bench/placement.py: two 8B replicas, packed vs spread (issue 32)
#   seed-energy, seed-shots  bench/seed_energy.py, bench/seed_shots.py on
#              SmolLM2-135M (issue 28); the model is carried in pieces (.seed/)
#   replay     bench/gpu_routing.py --phase replay, chat-traffic (issue 26)
#   seed-shots-cpu  seed 003 on the GPU host's cores (RAPL if readable)
# The calls' carries, since one call moves at most 64 MiB with the tree:
#   1. .whl .llama        2. .seed/a (+ .seed/HumanEval.jsonl.gz)
#   3. .seed/b            4. .data
# where .seed/a and .seed/b are `split -n 2` of the SmolLM2 GGUF
# (bench/prepare_h200.sh --seed writes them) and SMOL_SHA256 its hash:
#   JOULEGATE_COMMIT=<hash> SMOL_SHA256=<sha> bash bench/run_h200_session.sh
# JOBS="placement seed-shots" limits a call to those jobs; REPLAY_CONCURRENCY=1
# replays one request at a time only (~3.5 min instead of ~6).
set -euo pipefail
export PYTHONUNBUFFERED=1 JOULEGATE_DATA="${JOULEGATE_DATA:-$PWD/.data}"
start=$(date +%s)
left() { echo $(( 575 - ($(date +%s) - start) )); }
jobs="${JOBS:-placement seed-energy seed-shots replay seed-shots-cpu}"
OUT_DIR="${OUT:-/tmp/jg/out}"
W=/tmp/jg
mkdir -p "$OUT_DIR" "$W/res" "$W/seed" "$W/curves" "$W/cache/models" "$W/cache/data"
for p in .seed/*; do [ -f "$p" ] && cp -n "$p" "$W/seed/"; done
cp -n curves/h200/llama-*.json "$W/curves/" 2>/dev/null || true
need_models=0  # the random-weight shapes only for placement and the replay
[[ " $jobs " == *" placement "* || " $jobs " == *" replay "* ]] && need_models=1
if [ ! -x "$W/bin/llama-server" ] || { [ "$need_models" = 1 ] && [ ! -f "$W/models/llama-8b.gguf" ]; }; then
  OUT="$OUT_DIR" MODELS="llama-1b llama-8b" bash bench/device_setup.sh > /tmp/jg-setup.log 2>&1 \
    || { tail -30 /tmp/jg-setup.log; exit 1; }
  echo "setup done at $(( $(date +%s) - start )) s"
fi
export PYTHONPATH=/tmp/site:$PWD
fits() {  # fits JOB SECONDS: asked for, not done, and enough time left
  [[ " $jobs " == *" $1 "* ]] && [ ! -f "$W/res/$1.done" ] && [ "$(left)" -ge "$2" ]
}
if fits placement 240; then
  timeout "$(left)" python3 -m bench.placement --llama-server "$W/bin/llama-server" \
    --model "$W/models/llama-8b.gguf" --curve curves/h200/llama-8b.json --source nvml \
    --requests "${REQUESTS:-64}" --tokens "${TOKENS:-256}" --out "$W/res" | tail -5
  cp "$W"/res/placement-nvml.* "$OUT_DIR/" && touch "$W/res/placement.done"
fi
smol="$W/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$smol" ] && [ -f "$W/seed/a" ] && [ -f "$W/seed/b" ]; then
  cat "$W/seed/a" "$W/seed/b" > "$smol.part"
  echo "${SMOL_SHA256:?}  $smol.part" | sha256sum -c - && mv "$smol.part" "$smol"
  cp "$W/seed/HumanEval.jsonl.gz" "$W/cache/data/"
fi
export JOULEGATE_CACHE="$W/cache"
if [ -f "$smol" ] && fits seed-energy 180; then
  timeout "$(left)" python3 -m bench.seed_energy --source nvml \
    --llama-server "$W/bin/llama-server" --out "$W/seed-run" | tail -3
  cp bench/results/seed-energy-by-kind.json "$OUT_DIR/" && touch "$W/res/seed-energy.done"
fi
if [ -f "$smol" ] && fits seed-shots 100; then
  timeout "$(left)" python3 -m bench.seed_shots --source nvml --n "${SHOTS_N:-40}" \
    --llama-server "$W/bin/llama-server" --out "$W/shots-run" | tail -3
  cp bench/results/seed-shots-h200.json "$OUT_DIR/" && touch "$W/res/seed-shots.done"
fi
if [ -f "$smol" ] && fits seed-shots-cpu 200; then  # the GPU host's cores, RAPL if readable
  for src in rapl estimate; do
    timeout "$(left)" python3 -m bench.seed_shots --source "$src" --n "${SHOTS_N:-40}" \
      --label "gpu-host-cpu-$src" --llama-server "$W/bin/llama-server" --out "$W/shots-cpu" \
      2>&1 | tail -3 && [ -f "bench/results/seed-shots-gpu-host-cpu-$src.json" ] && break
  done
  cp bench/results/seed-shots-gpu-host-cpu-*.json "$OUT_DIR/" && touch "$W/res/seed-shots-cpu.done"
fi
if [ -d "$JOULEGATE_DATA" ] && fits replay 330; then
  timeout "$(left)" python3 bench/gpu_routing.py --phase replay --workload chat-traffic \
    --concurrency "${REPLAY_CONCURRENCY:-1,8}" \
    --llama-server "$W/bin/llama-server" --models-dir "$W/models" --out "$W/res" \
    --curves-dir "$W/curves" | tail -5
  cp "$W"/res/gpu-routing-chat-traffic* "$OUT_DIR/" && touch "$W/res/replay.done"
fi
echo "done in $(( $(date +%s) - start )) s: $(cd "$W/res" && ls ./*.done 2>/dev/null | xargs)"
