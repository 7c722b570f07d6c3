"""A real redis-server for the tests (Debian's package; .ci/run installs it):
one started per test that needs to stop it, or the one .ci/run started."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis

from app.tools.embedded import free_port

URL = "JOULEGATE_TEST_REDIS_URL"


def redis_binary() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
    if found is None:
        if os.environ.get("JOULEGATE_REQUIRE_REDIS") == "1":
            pytest.fail("redis-server is not installed (.ci/run installs it)")
        pytest.skip("no redis-server: apt-get install redis-server")
    return found


class RedisServer:
    """A redis-server of our own on a free port, that a test may stop and
    start again (same port, empty: no persistence)."""

    def __init__(self, folder: Path) -> None:
        self.binary = redis_binary()
        self.port = free_port()
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.folder)],
            stdout=(self.folder / "redis.log").open("ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(self.url, socket_timeout=0.5).ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server did not start on {self.port}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


def shared_redis_url(folder: Path) -> tuple[str, RedisServer | None]:
    """.ci/run's Redis (emptied), or one started here."""
    url = os.environ.get(URL)
    if url:
        redis.Redis.from_url(url).flushdb()
        return url, None
    server = RedisServer(folder)
    server.start()
    return server.url, server
