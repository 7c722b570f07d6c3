#!/usr/bin/env bash
# Start a Docker engine for the compose test if none answers (CI: root, no
# systemd). vfs is the storage driver that works inside these machines.
set -euo pipefail
docker="${DOCKER:-/usr/bin/docker}"
if "$docker" info >/dev/null 2>&1; then exit 0; fi
nohup dockerd --storage-driver=vfs >/var/log/joulegate-dockerd.log 2>&1 &
for _ in $(seq 60); do
  if "$docker" info >/dev/null 2>&1; then exit 0; fi
  sleep 0.5
done
echo "dockerd did not start:" >&2; tail -20 /var/log/joulegate-dockerd.log >&2; exit 1
