"""API keys: created once (the secret is shown once), stored as a hash in the
database (app.tenancy.database: SQLite in the state directory, or PostgreSQL shared by
several gateways), read by the gateway into memory and refreshed
every few seconds, so `joulegate keys ...` in another process takes effect
without a restart and a request's check never touches the database.

A secret is `jg-` + 43 URL-safe characters (256 random bits), so its SHA-256
is a safe stored form (no salt or slow hash is needed for random secrets).
Lookups go by hash and then compare in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import select

from app.tenancy.database import API_KEYS, Conflict, Database, DatabaseError

log = logging.getLogger("joulegate.keys")

BudgetPeriod = Literal["day", "week", "month"]
PREFIX = "jg-"
@dataclass(frozen=True)
class ApiKey:
    id: str
    name: str
    hash: str
    created: float
    revoked: float | None = None
    rpm: int | None = None  # requests per minute
    tpm: int | None = None  # tokens (prompt + completion) per minute
    joule_budget: float | None = None
    budget_period: BudgetPeriod = "month"
    models: tuple[str, ...] | None = None  # model names it may ask for; None: all

    def public(self) -> dict[str, Any]:
        """What `keys list` and the admin API show (never the hash)."""
        return {"id": self.id, "name": self.name, "created": self.created,
                "revoked": self.revoked, "rpm": self.rpm, "tpm": self.tpm,
                "joule_budget": self.joule_budget, "budget_period": self.budget_period,
                "models": list(self.models) if self.models is not None else None}


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def kept_secret(path: Path, create: bool) -> str | None:
    """The secret in `path` (mode 600); with `create`, a new one is written
    first if there is none (exclusively: concurrent starts agree on one)."""
    if create:
        secret = PREFIX + secrets.token_urlsafe(32)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secret + "\n")
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


class KeyStore:
    """The keys table (SQLite or PostgreSQL: app.tenancy.database). Thread-safe; one
    short statement per call."""

    def __init__(self, url: str) -> None:
        self._db = Database.open(url)

    def create(self, name: str, rpm: int | None = None, tpm: int | None = None,
               joule_budget: float | None = None, budget_period: BudgetPeriod = "month",
               models: Iterable[str] | None = None) -> tuple[ApiKey, str]:
        """A new key and its secret (shown once; only the hash is kept)."""
        secret = PREFIX + secrets.token_urlsafe(32)
        key = ApiKey(secrets.token_hex(8), name, digest(secret), time.time(), None, rpm, tpm,
                     joule_budget, budget_period, tuple(models) if models is not None else None)
        try:
            self._db.execute(API_KEYS.insert().values(
                id=key.id, name=name, hash=key.hash, created=key.created, rpm=rpm, tpm=tpm,
                joule_budget=joule_budget, budget_period=budget_period,
                models=",".join(key.models) if key.models is not None else None))
        except Conflict:
            raise ValueError(f"a key named {name!r} exists") from None
        return key, secret

    def update(self, name: str, **fields: Any) -> bool:
        allowed = {"rpm", "tpm", "joule_budget", "budget_period", "models"}
        if not fields or set(fields) - allowed:
            raise ValueError(f"can update {sorted(allowed)}")
        if "models" in fields and fields["models"] is not None:
            fields["models"] = ",".join(fields["models"])
        done = self._db.execute(
            API_KEYS.update().where(API_KEYS.c.name == name).values(**fields))
        return done.rowcount > 0

    def revoke(self, name: str) -> bool:
        done = self._db.execute(
            API_KEYS.update().where(API_KEYS.c.name == name, API_KEYS.c.revoked.is_(None))
            .values(revoked=time.time()))
        return done.rowcount > 0

    def all(self) -> list[ApiKey]:
        c = API_KEYS.c
        rows = self._db.execute(
            select(c.id, c.name, c.hash, c.created, c.revoked, c.rpm, c.tpm, c.joule_budget,
                   c.budget_period, c.models).order_by(c.created)).rows
        return [ApiKey(id=r[0], name=r[1], hash=r[2], created=r[3], revoked=r[4], rpm=r[5],
                       tpm=r[6], joule_budget=r[7], budget_period=r[8],
                       models=tuple(m for m in r[9].split(",") if m)
                       if r[9] is not None else None)
                for r in rows]

    def close(self) -> None:
        self._db.close()


ADMIN_ID = "admin"


class KeyRing:
    """The active keys in memory, by hash. A request's check is a dictionary
    lookup and never touches the database: `start` runs a thread that reloads
    the keys from the store every `refresh_s` (a failing database keeps the
    keys last loaded, and says so in the log). The admin key
    (JOULEGATE_ADMIN_KEY) is never stored: it is compared to the setting."""

    def __init__(self, store: KeyStore, refresh_s: float = 2.0,
                 admin_secret: str | None = None) -> None:
        self._store = store
        self._admin = ApiKey(ADMIN_ID, ADMIN_ID, digest(admin_secret), 0.0) \
            if admin_secret else None
        self._refresh_s = refresh_s
        self._by_hash: dict[str, ApiKey] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.database_ok = True  # the last reload worked (/readyz says degraded otherwise)
        self.refresh()

    def refresh(self) -> None:
        """Load the active keys now (start-up, the refresher thread, or a
        thread of its own after an admin's change: never an event loop)."""
        self._by_hash = {k.hash: k for k in self._store.all() if k.revoked is None}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._refreshing, name="joulegate-keys",
                                        daemon=True)
        self._thread.start()

    def _refreshing(self) -> None:
        while not self._stop.wait(self._refresh_s):
            try:
                self.refresh()
            except DatabaseError as exc:
                if self.database_ok:
                    log.warning("keys not reloaded (the last ones loaded stay): %s", exc)
                self.database_ok = False
            else:
                if not self.database_ok:
                    log.warning("keys reloaded: the database answers again")
                self.database_ok = True

    def close(self) -> None:
        """Stop the refresher and close the store."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._store.close()

    def active(self) -> bool:
        """Whether any key is active (else the gateway runs open)."""
        return bool(self._by_hash) or self._admin is not None

    def active_keys(self) -> list[ApiKey]:
        """The active keys, as last loaded."""
        return list(self._by_hash.values())

    @property
    def store(self) -> KeyStore:
        return self._store

    def find(self, secret: str) -> ApiKey | None:
        h = digest(secret)
        if self._admin is not None and hmac.compare_digest(self._admin.hash, h):
            return self._admin
        key = self._by_hash.get(h)
        if key is None or not hmac.compare_digest(key.hash, h):
            return None
        return key
