"""Gateway settings, read from the environment (prefix JOULEGATE_)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from telemetry.metrics import OWN_WATTS_PER_CORE

PolicyName = Literal["min-energy", "balanced", "max-quality"]


class Settings(BaseSettings):
    """Everything an operator can set without editing models.yaml."""

    model_config = SettingsConfigDict(env_prefix="JOULEGATE_", extra="ignore")

    models_file: Path = Path("models.yaml")
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    # Host names answered (comma-separated, * for any); unset: loopback names
    # when serving a loopback address (DNS rebinding), any otherwise.
    allowed_hosts: str | None = None
    # The longest a request's head (request line and headers) and then its
    # body may each take to arrive (then 408, connection closed).
    head_timeout_seconds: float = Field(default=10.0, gt=0)
    # Open connections a gateway process keeps, and from one client address
    # (0: no cap but the OS's; behind a proxy every client is the proxy's
    # address). A connection beyond them gets a 503 / 429 and is closed.
    max_connections: int = Field(default=0, ge=0)
    max_connections_per_client: int = Field(default=0, ge=0)
    body_timeout_seconds: float = Field(default=10.0, gt=0)
    connect_timeout_seconds: float = Field(default=5.0, gt=0)
    # A worker's first byte (its queue wait and prefill), then the longest
    # silence between two chunks of an answer.
    first_byte_timeout_seconds: float = Field(default=120.0, gt=0)
    between_chunks_timeout_seconds: float = Field(default=30.0, gt=0)
    # How long a request may wait for a replica slot before a 429.
    queue_timeout_seconds: float = Field(default=30.0, gt=0)
    upstream_keepalive_seconds: float = Field(default=4.0, gt=0)
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    health_interval_seconds: float = Field(default=2.0, gt=0)
    # joulegate's own HTTP/1.1 client (app/upstream/http1.py), or httpx (e.g. for a proxy
    # from the environment).
    upstream_transport: Literal["http1", "httpx"] = "http1"
    policy: PolicyName = "balanced"
    # A key that has spent this share of its joule budget is routed to the
    # fewest expected joules (`auto`); 1 turns steering off.
    budget_steer_at: float = Field(default=0.8, gt=0, le=1)
    sample_hz: float = Field(default=20.0, gt=0, le=100)
    # While at most a few requests run on a device (telemetry/sampler.py)
    sample_hz_quiet: float = Field(default=100.0, gt=0, le=100)
    agent_url: str | None = None
    # The token gateways send to their agent and the agent requires (window
    # calls); or a file holding it (`joulegate agent` creates it when missing:
    # compose shares it between the agent and the gateway through a volume).
    agent_token: str | None = None
    agent_token_file: Path | None = None
    # Learned lengths, bootstrap keys and (by default) the keys-and-usage
    # database, state_dir/joulegate.db (SQLite), live here.
    state_dir: Path = Path(".joulegate")
    # postgresql://user:password@host/db: keys, budgets and the usage ledger
    # shared by several gateways (instead of the SQLite file).
    database_url: str | None = None
    # Serve a non-loopback address without any API key (otherwise refused).
    allow_unauthenticated: bool = False
    # With no key yet on a non-loopback bind: create one, write it to
    # state_dir/first-key (mode 600) and say where (the container image sets it).
    bootstrap_key: bool = False
    # The admin key: manages keys through /v1/admin/keys and sees all usage.
    admin_key: str | None = None
    # The host's watts per busy CPU core, for the gateway's own joules
    # (joulegate_own_energy_joules, source `estimate`) where RAPL cannot
    # measure them (telemetry/corewatts.py): ~10 W is a server package's TDP
    # over its cores (e.g. 205 W / 20 cores).
    cpu_watts_per_core: float = Field(default=OWN_WATTS_PER_CORE, gt=0, le=1000)
    # redis://host:6379/0: rate windows and joule holds shared by every gateway
    # (unset: each gateway process keeps its own)
    redis_url: str | None = None
    # The longest a request waits for Redis; 3 in a row (or a refused
    # connection) and the gateway goes local until Redis answers again.
    redis_timeout_ms: float = Field(default=50.0, gt=0, le=1000)
    log_level: str = "info"

    def agent_secret(self, create: bool = False) -> str | None:
        """The agent token: JOULEGATE_AGENT_TOKEN, else the token file's content
        (`create`: a new random token written there, mode 600, when missing)."""
        if self.agent_token:
            return self.agent_token
        path = self.agent_token_file
        if path is None:
            return None
        if create and not path.exists():
            import os
            import secrets

            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:  # another agent made it meanwhile
                pass
            else:
                with os.fdopen(fd, "w") as f:
                    f.write(secrets.token_urlsafe(32) + "\n")
        try:
            return path.read_text().strip() or None
        except OSError as exc:
            raise ValueError(f"JOULEGATE_AGENT_TOKEN_FILE: cannot read {path}: "
                             f"{exc.strerror or exc}") from None

    def database(self) -> str:
        """The keys-and-usage database URL (the SQLite file by default)."""
        return self.database_url or f"sqlite:///{(self.state_dir / 'joulegate.db').resolve()}"


def is_loopback(host: str | None) -> bool:
    """Whether `host` (a name or an address) is this machine's loopback."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return host is not None and ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
