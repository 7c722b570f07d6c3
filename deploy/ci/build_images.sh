#!/usr/bin/env bash
# Build every image the CPU compose stack runs, from this repository only, on
# a machine that cannot pull images (CI): a Debian bookworm base with Python
# made by debootstrap from the Debian mirror apt uses, then the gateway image,
# the CPU llama.cpp worker image and (CI only) Prometheus and Redis from
# Debian's packages.
# Docker's layer cache makes a second run take seconds.
#
#   deploy/ci/build_images.sh        # needs root (debootstrap) and a running dockerd
#
# Env: DOCKER (default /usr/bin/docker, Debian's docker.io CLI with BuildKit
# built in), CA_BUNDLE (the CA bundle pip and the sdist download trust; passed
# as a build secret, never stored in an image), DEBIAN_MIRROR.
set -euo pipefail
cd "$(dirname "$0")/../.."
docker="${DOCKER:-/usr/bin/docker}"
base=joulegate-ci/python:3.11-bookworm
ca="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

if ! "$docker" image inspect "$base" >/dev/null 2>&1; then
  mirror="${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' \
    /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)}"
  mirror="${mirror:-http://deb.debian.org/debian}"
  root="$(mktemp -d)"
  chmod 755 "$root"  # it becomes the image's /: mktemp's 700 would lock out non-root users
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" "$mirror" >&2
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/*
  tar -C "$root" -c . | "$docker" import - "$base" >&2
  rm -rf "$root"
fi

build() {
  DOCKER_BUILDKIT=1 "$docker" build --progress=plain --build-arg "BASE_IMAGE=$base" \
    --secret "id=ca,src=$ca" "$@" >&2
}
build -t joulegate:0.1.0 .
build -f workers/llama-server.Dockerfile -t joulegate-llama-server:0.3.36-cpu .
build -f deploy/ci/prometheus.Dockerfile -t joulegate-ci/prometheus:2.42-debian deploy/ci
build -f deploy/ci/redis.Dockerfile -t joulegate-ci/redis:7.0-debian deploy/ci
