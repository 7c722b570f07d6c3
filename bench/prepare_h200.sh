#!/usr/bin/env bash
# Prepare what bench/run_h200.sh carries to the GPU machine, which has no network:
#   .whl/                 wheels for the device's Python 3.12 (x86_64) of the packages
#                         its image lacks, at the versions this checkout's venv runs
#   .llama/llama-src.tgz  the llama.cpp sources of the pinned llama-cpp-python sdist,
#                         trimmed (no models, docs, tests, benches)
#   .data/                the ../shared/data files the benchmarks read
#   .tools/               nginx and wrk (this machine's Debian builds, their libraries
#                         beside them) for bench.gateways on the GPU host's 16 cores
#
#   bash bench/prepare_h200.sh        # after `make test` (or `make llama-server`)
# then, through the device tool: carry [".whl", ".llama", ".data"] and run
#   JOULEGATE_COMMIT=<hash> bash bench/run_h200.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
pkgs=(fastapi starlette pydantic pydantic-core pydantic-settings python-dotenv annotated-types
      typing-inspection typing-extensions uvicorn h11 httptools gguf click scikit-learn joblib
      threadpoolctl orjson alembic sqlalchemy mako psycopg psycopg-binary opentelemetry-api
      annotated-doc swagger-ui-bundle redis)
specs=$($PY - "${pkgs[@]}" <<'PYEOF'
import sys
from importlib.metadata import version
print(" ".join(f"{p}=={version(p)}" for p in sys.argv[1:]))
PYEOF
)
rm -rf .whl && mkdir -p .whl
# shellcheck disable=SC2086
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --abi abi3 --abi none --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform any \
  -d .whl $specs
bash workers/build_llama_server.sh >/dev/null   # fetches and unpacks the sdist if needed
src="${JOULEGATE_CACHE:-$HOME/.cache/joulegate}/src-${LLAMA_CPP_PYTHON_VERSION:-0.3.36}/vendor"
rm -rf .llama && mkdir -p .llama
tar czf .llama/llama-src.tgz -C "$src" --exclude=llama.cpp/models --exclude=llama.cpp/docs \
  --exclude=llama.cpp/tests --exclude=llama.cpp/benches --exclude=llama.cpp/media \
  --exclude=llama.cpp/.git llama.cpp
data="${JOULEGATE_DATA:-../shared/data}"
rm -rf .data && mkdir -p .data/mmlu
cp -r "$data/gsm8k" "$data/arena-hard" .data/
cp -r "$data/mmlu/test" .data/mmlu/
# nginx and wrk, with the libraries the GPU host's image may lack; each runs
# through a wrapper that points the loader at them (Python keeps the host's).
rm -rf .tools && mkdir -p .tools/bin .tools/libexec .tools/lib
for exe in /usr/sbin/nginx /usr/bin/wrk; do
  [ -x "$exe" ] || apt-get install -y -q --no-install-recommends nginx-light wrk >/dev/null
  name=$(basename "$exe")
  cp "$exe" .tools/libexec/
  ldd "$exe" | awk '/=> \// {print $3}' | grep -v -E 'libc\.so|libm\.so|libpthread|libgcc_s' \
    | xargs -r cp -n -t .tools/lib/
  printf '#!/bin/sh\nd=$(dirname "$0")/..\nLD_LIBRARY_PATH="$d/lib" exec "$d/libexec/%s" "$@"\n' \
    "$name" > ".tools/bin/$name"
  chmod +x ".tools/bin/$name"
done
du -sh .whl .llama .data .tools
# --seed: SmolLM2 (make real-model) and HumanEval in two pieces for
# bench/run_h200_session.sh, which carries them in separate calls.
if [ "${1:-}" = "--seed" ]; then
  cache="${JOULEGATE_CACHE:-$HOME/.cache/joulegate}"
  rm -rf .seed && mkdir -p .seed
  (cd .seed && split -n 2 -a 1 "$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf" "" )
  cp "$cache/data/HumanEval.jsonl.gz" .seed/
  echo "SMOL_SHA256=$(sha256sum "$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d' ' -f1)"
  du -sh .seed/*
fi
