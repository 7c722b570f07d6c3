#!/usr/bin/env bash
# docker compose on a host that cannot pull images: every image of the CPU
# profile is built here from this repository (deploy/ci/build_images.sh: a
# Debian base made with debootstrap, the gateway, llama-server for CPUs and
# Prometheus from Debian's package), then the CPU profile is started with
# deploy/ci/compose.ci.yml, which only swaps Prometheus's image. Grafana is
# not started (its image cannot be built here; its profile stays off).
#
#   sudo deploy/compose-offline.sh            # needs root (debootstrap) and a running dockerd
#   sudo deploy/compose-offline.sh down -v    # any other compose command, same files
set -euo pipefail
cd "$(dirname "$0")/.."
if docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
else
  compose=(docker-compose)
fi
files=(-f docker-compose.yml -f deploy/ci/compose.ci.yml --profile cpu)
if [ $# -gt 0 ]; then
  exec "${compose[@]}" "${files[@]}" "$@"
fi
bash deploy/ci/build_images.sh
"${compose[@]}" "${files[@]}" up -d --no-build
cat <<MSG
joulegate (CPU profile) is starting: http://127.0.0.1:${GATEWAY_PORT:-8000}/v1
First API key (written on first start):
  ${compose[*]} ${files[*]} exec -T gateway-cpu cat /srv/joulegate/state/first-key
Prometheus: http://127.0.0.1:${PROMETHEUS_PORT:-9090}   Stop: $0 down
MSG
