#!/usr/bin/env bash
# Build llama.cpp's llama-server once from the sources vendored in the pinned
# llama-cpp-python sdist on PyPI, into a cache outside the repository.
#
#   workers/build_llama_server.sh            # CPU build, prints the binary path
#   JOULEGATE_CUDA=1 workers/build_llama_server.sh   # CUDA (sm_90) build
#
# Env: JOULEGATE_CACHE (default ~/.cache/joulegate), LLAMA_CPP_PYTHON_VERSION,
# JOULEGATE_SDIST (a local sdist .tar.gz, skips the download: used on the GPU host).
set -euo pipefail
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
cache="${JOULEGATE_CACHE:-$HOME/.cache/joulegate}"
flavour=cpu
cmake_flags=(-DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF)
if [[ "${JOULEGATE_CUDA:-0}" == "1" ]]; then
  flavour=cuda
  cmake_flags+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
fi
out="$cache/llama-server-$version-$flavour"
bin="$out/bin/llama-server"
if [[ -x "$bin" ]]; then echo "$bin"; exit 0; fi

src="$cache/src-$version"
if [[ ! -d "$src/vendor/llama.cpp" ]]; then
  mkdir -p "$cache/dl"
  sdist="${JOULEGATE_SDIST:-}"
  if [[ -z "$sdist" ]]; then
    sdist="$(python3 "$(dirname "$0")/fetch_sdist.py" llama-cpp-python "$version" "$cache/dl")"
  fi
  rm -rf "$src.tmp" && mkdir -p "$src.tmp"
  tar -xzf "$sdist" -C "$src.tmp" --strip-components=1
  mv "$src.tmp" "$src"
fi
jobs="$(nproc)"
build="$out/build"
cmake -S "$src/vendor/llama.cpp" -B "$build" "${cmake_flags[@]}" >&2
cmake --build "$build" --target llama-server -j "$jobs" >&2
mkdir -p "$out/bin"
cp "$build/bin/llama-server" "$bin.tmp" && mv "$bin.tmp" "$bin"
echo "$bin"
