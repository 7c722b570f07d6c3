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
python3 - <<'PY'
import os, time
def spin(n=30_000_000):
    t = time.perf_counter(); sum(range(n)); return time.perf_counter() - t
alone = spin()
pid = os.fork()
if pid == 0:
    os.sched_setaffinity(0, {5}); spin(); os._exit(0)
os.sched_setaffinity(0, {5}); both = spin(); os.waitpid(pid, 0)
print(f"pinning check: alone {alone:.3f} s, two on one core {both:.3f} s "
      f"({'pinning holds' if both > 1.6 * alone else 'pinning NOT enforced'})")
PY
timeout 570 python3 -m bench.gateways --pin --no-litellm --seconds "${SECONDS_EACH:-5}" \
  --rounds "${ROUNDS:-3}" \
  --out "$out/gateways-h200-host.json"
