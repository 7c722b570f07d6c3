#!/usr/bin/env bash
# bench.gateways on the GPU host (16 cores; no GPU used), parts pinned to cores
# of their own (--pin), without LiteLLM (no network there to install it).
#
#   bash bench/prepare_h200.sh     # here, once: .whl (the wheels) and .tools (nginx, wrk)
# then, through the device tool (carry [".whl", ".tools"]):
#   JOULEGATE_COMMIT=<hash> bash bench/run_gateways_device.sh
# <hash>: `git rev-parse --short HEAD` of this checkout, written out (the device's
# git may hold an older commit than the tree it carries: results would name that).
# ROUNDS (3) rounds in turns of SECONDS_EACH (5) s a case: ~7 min, inside a call's 10.
# -> $OUT/gateways-h200-host.json and .png (copy them to bench/results/).
set -euo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=$PWD/.tools/bin:$PATH
out="${OUT:-bench/results}"
timeout 570 python3 -m bench.gateways --pin --no-litellm --seconds "${SECONDS_EACH:-5}" \
  --rounds "${ROUNDS:-3}" \
  --out "$out/gateways-h200-host.json"
