# Sourced by the single-GPU device scripts (run_h200.sh, run_h200_mixed.sh,
# run_h200_thinking.sh) after they set LIMIT_S (the seconds this call may use,
# inside the device tool's 10 minutes) and SETUP_MODELS (the shapes to write):
# the clock (`left` prints the seconds still free), $OUT_DIR (what the device
# tool brings back), /tmp/jg/res (results on a warm machine), and the setup
# (bench/device_setup.sh; its log's tail, and the call ends, if it fails).
export PYTHONUNBUFFERED=1 JOULEGATE_DATA="${JOULEGATE_DATA:-$PWD/.data}"
start=$(date +%s)
left() { echo $(( LIMIT_S - ($(date +%s) - start) )); }
OUT_DIR="${OUT:-/tmp/jg/out}"
mkdir -p "$OUT_DIR" /tmp/jg/res
OUT= MODELS="$SETUP_MODELS" bash bench/device_setup.sh > /tmp/jg-setup.log 2>&1 \
  || { tail -30 /tmp/jg-setup.log; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
