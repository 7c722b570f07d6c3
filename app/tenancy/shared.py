"""Limits shared by every gateway through Redis: each key's request and token
windows, its in-flight joule reservations and its settled joules this period.

Each operation is one Lua script, run atomically by Redis on its own clock
(`TIME`), so N gateways (and `serve --workers N`) enforce one limit and agree
on when a window ends. Keys are hash-tagged by API key id (`jg:{id}:...`): a
key's state lives in one slot of a Redis Cluster.

Redis may be slow or gone: no request waits for it longer than `timeout_s`
(50 ms by default); a call past it answers None (that request is admitted
locally) while Redis finishes it in the background. A refused connection, or
a slow call followed by a PING unanswered for `CHECK_S`, marks the state down
(logged once, the `joulegate_shared_state_up` gauge at 0), and every call
answers None at once until a background probe finds Redis again. So a Redis
that is gone costs a request nothing, one that hangs costs the requests of
its first second `timeout_s` each, and a loaded gateway (slow to read a
quick answer) is not mistaken for a dead Redis. The caller (app/tenancy/
admission.py) then enforces its local windows. Foreign errors stop here:
callers see None, never a redis-py exception.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import RedisError

log = logging.getLogger("joulegate.shared")

WINDOW_S = 60
HOLD_TTL_S = 900  # a reservation its gateway never settled (killed) lapses after this
PROBE_EVERY_S = 0.5
UNSENT_MAX = 10_000  # settles kept while Redis is down, sent when it answers again
CHECK_S = 1.0  # a PING slower than this: Redis is down
MAX_CONNECTIONS = 32  # per gateway process: a burst waits for one, no connect storm

# KEYS: requests zset, tokens zset, tokens sum. ARGV: rpm, tpm (-1: none),
# this request's member, window seconds. -> {limit or '', seconds to wait}
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local window = tonumber(ARGV[4])
local start = now - window
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', start)
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', start)
if #gone > 0 then
  local n = 0
  for _, m in ipairs(gone) do n = n + tonumber(string.match(m, ':(%d+)$')) end
  redis.call('DECRBY', KEYS[3], n)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', start)
end
local rpm = tonumber(ARGV[1])
if rpm >= 0 and redis.call('ZCARD', KEYS[1]) >= rpm then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {'rpm', tostring(tonumber(first[2]) + window - now)}
end
local tpm = tonumber(ARGV[2])
if tpm >= 0 and tonumber(redis.call('GET', KEYS[3]) or '0') >= tpm then
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if first[2] then return {'tpm', tostring(tonumber(first[2]) + window - now)} end
end
redis.call('ZADD', KEYS[1], now, ARGV[3])
redis.call('EXPIRE', KEYS[1], window + 1)
return {'', '0'}
"""

# KEYS: tokens zset, tokens sum. ARGV: a unique member, tokens, window seconds.
_TOKENS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now, ARGV[1] .. ':' .. ARGV[2])
redis.call('INCRBY', KEYS[2], ARGV[2])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]) + 1)
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]) + 1)
return 1
"""

# Drops reservations past their expiry (their gateway died holding them).
_LAPSE = """
local function lapse(now)
  local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  for _, id in ipairs(stale) do
    local j = redis.call('HGET', KEYS[1], id)
    if j then
      redis.call('HDEL', KEYS[1], id)
      redis.call('INCRBYFLOAT', KEYS[3], -tonumber(j))
    end
  end
  if #stale > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now) end
  if redis.call('HLEN', KEYS[1]) == 0 then redis.call('DEL', KEYS[3]) end
end
"""

# KEYS: holds hash (id -> J), hold expiries zset, held sum, spent this period.
# ARGV: hold id, joules, the ledger's spent, budget, hold ttl, spent ttl.
# -> {1 reserved or 0 refused, spent, held}
_RESERVE = _LAPSE + """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
lapse(now)
local held = tonumber(redis.call('GET', KEYS[3]) or '0')
local spent = math.max(tonumber(ARGV[3]), tonumber(redis.call('GET', KEYS[4]) or '0'))
if spent + held >= tonumber(ARGV[4]) then
  return {0, tostring(spent), tostring(held)}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), ARGV[1])
redis.call('INCRBYFLOAT', KEYS[3], ARGV[2])
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], tonumber(ARGV[5]) + 1) end
return {1, tostring(spent), tostring(held)}
"""

# KEYS: as _RESERVE. ARGV: hold id, net joules spent, spent ttl.
_SETTLE = """
local j = redis.call('HGET', KEYS[1], ARGV[1])
if j then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('INCRBYFLOAT', KEYS[3], -tonumber(j))
  if redis.call('HLEN', KEYS[1]) == 0 then redis.call('DEL', KEYS[3]) end
end
if tonumber(ARGV[2]) > 0 then
  redis.call('INCRBYFLOAT', KEYS[4], ARGV[2])
  redis.call('EXPIRE', KEYS[4], tonumber(ARGV[3]))
end
return 1
"""


@dataclass(frozen=True)
class SharedRefusal:
    limit: str  # "rpm" | "tpm"
    retry_after_s: int


def _keys(key_id: str, *names: str) -> list[str]:
    return [f"jg:{{{key_id}}}:{n}" for n in names]


class SharedState:
    """One gateway's connection to the shared limits. Every method answers
    None when Redis could not answer in time (the caller goes local)."""

    def __init__(self, url: str, timeout_s: float = 0.05,
                 on_up: Callable[[bool], None] = lambda up: None) -> None:
        self._redis = Redis(connection_pool=BlockingConnectionPool.from_url(
            url, max_connections=MAX_CONNECTIONS, timeout=None,
            socket_timeout=CHECK_S, socket_connect_timeout=CHECK_S))
        self._url = _safe(url)
        self._timeout_s = timeout_s
        self._on_up = on_up
        self.up = False
        self._check: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        # Settles that could not be sent (Redis down): their holds would stay
        # held, and their joules unspent, until HOLD_TTL_S; sent on recovery.
        self._unsent: deque[tuple[list[str], list[str | int]]] = deque(maxlen=UNSENT_MAX)
        self.unsent_dropped = 0
        self._me = secrets.token_hex(4)  # this gateway's prefix for window members
        self._n = 0
        self._admit = self._redis.register_script(_ADMIT)
        self._tokens = self._redis.register_script(_TOKENS)
        self._reserve = self._redis.register_script(_RESERVE)
        self._settle = self._redis.register_script(_SETTLE)

    async def start(self) -> None:
        """Connect, and load the scripts (or start probing for Redis in the
        background)."""
        try:
            await asyncio.wait_for(self._load(), CHECK_S)
        except (RedisError, OSError, TimeoutError) as exc:
            self._down(exc)
            return
        self._set_up(True)
        log.info("limits shared through Redis at %s", self._url)

    async def _load(self) -> None:
        for script in (self._admit, self._tokens, self._reserve, self._settle):
            await self._redis.script_load(script.script)

    async def close(self) -> None:
        """Stop probing and sending, and close the pool's connections; bounded
        by CHECK_S, so a Redis that hangs cannot hold up a gateway's shutdown."""
        for waiting in (self._probe, self._check):
            if waiting is not None:
                waiting.cancel()
        for task in list(self._tasks):
            task.cancel()
        try:  # the pool is this object's own: close its connections too
            await asyncio.wait_for(self._redis.aclose(close_connection_pool=True), CHECK_S)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("shared limits: closing the connections to %s: %s", self._url,
                        type(exc).__name__)

    def _member(self) -> str:
        self._n += 1
        return f"{self._me}-{self._n}"

    # -- operations ------------------------------------------------------
    async def admit(self, key_id: str, rpm: int | None, tpm: int | None
                    ) -> SharedRefusal | bool | None:
        """False: admitted and counted; a refusal; None: Redis did not answer."""
        out = await self._call(lambda: self._admit(
            keys=_keys(key_id, "req", "tok", "toksum"),
            args=[-1 if rpm is None else rpm, -1 if tpm is None else tpm, self._member(),
                  WINDOW_S]))
        if out is None:
            return None
        limit, wait = (_text(v) for v in out)
        if not limit:
            return False
        return SharedRefusal(limit, max(1, math.ceil(float(wait))))

    def tokens(self, key_id: str, tokens: int) -> None:
        """Count a finished request's tokens (in the background)."""
        self._background(lambda: self._tokens(
            keys=_keys(key_id, "tok", "toksum"), args=[self._member(), tokens, WINDOW_S]))

    async def reserve(self, key_id: str, hold_id: str, joules: float, spent_j: float,
                      budget_j: float, period: int, spent_ttl_s: int) -> bool | None:
        """Reserve `joules` if the key's spent and held joules leave room under
        its budget (spent: the larger of the ledger's and the shared counter)."""
        out = await self._call(lambda: self._reserve(
            keys=self._hold_keys(key_id, period),
            args=[hold_id, repr(float(joules)), repr(float(spent_j)), repr(float(budget_j)),
                  HOLD_TTL_S, spent_ttl_s]))
        return None if out is None else int(out[0]) == 1

    def settle(self, key_id: str, hold_id: str, net_j: float, period: int,
               spent_ttl_s: int) -> None:
        """Release a reservation (if still held) and add the joules it cost; kept
        and sent when Redis answers again if it is down now (never sent twice:
        one that timed out may still land, so it is not kept)."""
        keys = self._hold_keys(key_id, period)
        args: list[str | int] = [hold_id, repr(float(net_j)), spent_ttl_s]
        if not self.up:
            if len(self._unsent) == self._unsent.maxlen:
                self.unsent_dropped += 1
            self._unsent.append((keys, args))
            return
        self._background(lambda: self._settle(keys=keys, args=args))

    async def _send_unsent(self) -> None:
        """The settles kept while Redis was down, oldest first; stops (keeping
        the rest) if Redis goes away again."""
        sent = 0
        while self._unsent and self.up:
            keys, args = self._unsent[0]
            try:
                await asyncio.wait_for(self._settle(keys=keys, args=args), CHECK_S)
            except (RedisError, OSError, TimeoutError) as exc:
                self._down(exc)
                break
            self._unsent.popleft()
            sent += 1
        if sent:
            log.warning("shared limits: sent %d settles kept while Redis was down%s", sent,
                        f" ({self.unsent_dropped} dropped: more than {UNSENT_MAX} waited)"
                        if self.unsent_dropped else "")

    @staticmethod
    def _hold_keys(key_id: str, period: int) -> list[str]:
        return _keys(key_id, "holds", "hold_exp", "held", f"spent:{period}")

    # -- failure handling ------------------------------------------------
    async def _call(self, op: Callable[[], Awaitable[Any]]) -> Any:
        if not self.up and self._probe is not None:
            return None
        task = asyncio.ensure_future(op())
        try:  # shielded: an answer that comes late still lands, its connection kept
            return await asyncio.wait_for(asyncio.shield(task), self._timeout_s)
        except TimeoutError:
            if task.done() and not task.cancelled() and task.exception() is None:
                return task.result()  # it came in the turn the timer fired
            task.add_done_callback(_retrieve)
            if self._check is None or self._check.done():
                self._check = asyncio.get_running_loop().create_task(self._checking())
            return None
        except (RedisError, OSError) as exc:
            self._down(exc)
            return None

    async def _unanswered(self) -> BaseException | None:
        """Why a PING got no answer within CHECK_S; None when it did."""
        try:
            await asyncio.wait_for(self._redis.ping(), CHECK_S)
        except (RedisError, OSError, TimeoutError) as exc:
            return exc
        return None

    async def _checking(self) -> None:
        """A call was slow: is Redis there at all? (A loaded gateway is slow
        too; only a Redis that does not answer a PING in a second is down.)"""
        exc = await self._unanswered()
        if exc is not None:
            self._down(exc)

    def _background(self, op: Callable[[], Awaitable[Any]]) -> None:
        if not self.up:
            return
        task = asyncio.get_running_loop().create_task(self._call(op))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _down(self, exc: BaseException) -> None:
        if self.up or self._probe is None:
            log.warning("shared limits: Redis at %s did not answer (%s); each gateway "
                        "enforces its own windows until it does", self._url,
                        type(exc).__name__ if isinstance(exc, TimeoutError) else exc)
        self._set_up(False)
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._probing())

    async def _probing(self) -> None:
        while True:
            await asyncio.sleep(PROBE_EVERY_S)
            if await self._unanswered() is not None:
                continue
            log.warning("shared limits: Redis at %s answers again; limits are shared",
                        self._url)
            self._set_up(True)
            if self._unsent:  # a task of its own: this probe is over when it runs
                task = asyncio.get_running_loop().create_task(self._send_unsent())
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            return

    def _set_up(self, up: bool) -> None:
        self.up = up
        self._on_up(up)


def _retrieve(task: asyncio.Future[Any]) -> None:
    """A late call's outcome, read so that asyncio does not log it."""
    if not task.cancelled():
        task.exception()


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _safe(url: str) -> str:
    """The URL without its password, for logs."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    return scheme + sep + rest
