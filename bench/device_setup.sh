#!/usr/bin/env bash
# GPU host setup for the benchmarks (run through the device tool, repo root as cwd).
#   - installs the carried wheels (.whl/) into /tmp/site
#   - builds a CUDA llama-server from the carried trimmed sources
#     (.llama/llama-src.tgz), unless a carried build (.llama/llama-server-cuda.tgz.*) exists
#   - writes the random-weight GGUF models named in $MODELS (default: llama-1b)
#   - copies the packed build to $OUT so later sessions can carry it instead of rebuilding
# Idempotent: what already exists under /tmp/jg is reused.
# The device copy has no .git: export JOULEGATE_COMMIT=<hash> for the result files.
set -euo pipefail
W=/tmp/jg
mkdir -p "$W/models"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
if [ ! -x "$W/bin/llama-server" ] && ls .llama/llama-server-cuda.tgz.* >/dev/null 2>&1; then
  cat .llama/llama-server-cuda.tgz.* | tar xzf - -C "$W"
fi
pids=()
if [ ! -x "$W/bin/llama-server" ]; then
  rm -rf "$W/src" && mkdir -p "$W/src" && tar xzf .llama/llama-src.tgz -C "$W/src"
  ( cmake -S "$W/src/llama.cpp" -B "$W/build" -G Ninja -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release \
    && cmake --build "$W/build" --target llama-server -j 16 \
    && mkdir -p "$W/bin" && cp "$W/build/bin/llama-server" "$W/bin/" ) > "$W/build.log" 2>&1 &
  pids+=($!)
fi
for m in ${MODELS:-llama-1b}; do
  python3 workers/make_models.py --shape "$m" --out "$W/models/$m.gguf" > "$W/model-$m.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
tail -3 "$W/build.log" 2>/dev/null || true
[ "$rc" = 0 ] || { tail -40 "$W/build.log"; exit 1; }
ls -la "$W/bin" "$W/models"
if [ -n "${OUT:-}" ] && [ ! -e "$W/packed" ]; then
  (cd "$W" && tar czf - bin | split -b 15M - "$OUT/llama-server-cuda.tgz.") && touch "$W/packed"
  ls -la "$OUT"
fi
