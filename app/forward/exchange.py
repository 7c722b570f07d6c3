"""One request to one worker, from taking a replica slot to its settled energy.

An `Exchange` owns everything a forwarded request holds: the replica slot,
the energy window, the token timeline and the upstream response. `begin`
takes them (retrying a dropped keep-alive connection once on a new
connection, and moving on to the backend's next replica when one cannot be
reached); `end` is the single exit that releases them all, tells the
replica's breaker how it went, records the metrics, and leaves the meter what
to do with the final energy figure (record it, write the usage row).
`end` runs once, however the request ends (`async with` guarantees it; it is
shielded from a client disconnect's cancellation).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import Any

from app import jsonio
from app.forward import sse
from app.forward.plan import Forward
from app.forward.usage import (
    InlineThinking,
    cached_tokens,
    chunk_text,
    chunk_thinks,
    loop_chunk,
    mark_whole,
    plus_prior,
    usage_tokens,
    with_thinking,
)
from app.forward.watch import shielded
from app.metering.meter import Meter
from app.tenancy.admission import Hold
from app.tenancy.spend import UsageRow
from app.upstream.client import Upstream, UpstreamError, UpstreamResponse
from app.upstream.pool import Ejected, NoReplica, ReplicaPool, ReplicaState
from router.decision import Decision
from router.loopguard import LoopGuard
from telemetry.metrics import Metrics
from telemetry.rates import TOKEN_COUNTS, TokenRates
from telemetry.timeline import EnergyFigure, TokenTimeline

log = logging.getLogger("joulegate.exchange")

# Outcomes that say the replica is unwell (its breaker counts them).
_REPLICA_FAULTS = {"upstream_timeout", "upstream_broken", "upstream_invalid"}


MAX_OWNERS = 20_000  # as many as the ledger keeps figures for
# A backend with a latency bound hears each answer's pace this many answer
# tokens in (so a long answer's batch is known early), and again at its end.
EARLY_PACE_TOKENS = 32


@dataclass
class Parts:
    """What every exchange uses, built once by the app factory."""

    pool: ReplicaPool
    upstream: Upstream
    meter: Meter
    metrics: Metrics
    # a finished request: its decision, completion tokens, of which thinking
    on_complete: Callable[[Decision, int, int], None] = lambda d, n, t: None
    rates: Mapping[str, TokenRates] = field(default_factory=dict)  # backend -> curve's
    on_tokens: Callable[[str, int], None] = lambda key_id, n: None  # a key's tokens spent
    on_usage: Callable[[UsageRow], None] = lambda row: None  # a finished request's row
    # the same row as the answer leaves, with the response's figure (journaled)
    on_answered: Callable[[UsageRow], None] = lambda row: None
    # a request's joule hold and the net joules it cost (its final figure)
    on_settled: Callable[[Hold | None, float | None], None] = lambda hold, net_j: None
    # energy id -> the API key that made the request (recent ones; GET /v1/energy),
    # oldest first (an OrderedDict: dropping a dict's first item each time is a scan)
    owners: OrderedDict[str, str] = field(default_factory=OrderedDict)


class Exchange:
    def __init__(self, parts: Parts, fw: Forward, count: bool = True) -> None:
        self.parts = parts
        self.fw = fw
        self.count = count  # a spliced thinking phase is not a request of its own
        self.state: ReplicaState | None = None
        self.response: UpstreamResponse | None = None
        self.window: str | None = None
        self.timeline = TokenTimeline()
        self.status = "ok"
        self.usage_event: dict[str, Any] | None = None
        self.decode = 0
        self.thinking = 0  # of `decode`, the tokens inside the think span
        self._reasons = fw.reasoning  # count them? (any reasoning backend's, asked by name too)
        self._inline = InlineThinking() if fw.reasoning else None
        self.figure: EnergyFigure | None = None
        self.usage: dict[str, Any] | None = None
        self._last: dict[str, Any] | None = None
        self._rename: tuple[str, bytes, bytes] | None = None  # worker's model, as JSON, ours
        self._sent_at = 0.0
        self.worker_done_at: float | None = None  # the worker's last byte read
        self.placement = ""  # why the pool chose its replica
        self._batch = 0  # the replica's requests when this one took its slot, itself included
        self._pace_at = 0  # the answer token at which the pace is reported early (0: never)
        self._ended = False

    # -- taking ----------------------------------------------------------
    async def begin(self) -> None:
        """Take a slot, open the window, send; raises NoReplica / Overloaded /
        UpstreamError with nothing held."""
        fw, pool = self.fw, self.parts.pool
        payload = jsonio.dumps(fw.body)
        tried: list[int] = []
        last: UpstreamError | None = None
        while True:
            try:
                state, self.placement = await pool.acquire_placed(fw.decision.backend, tried)
            except NoReplica:
                if last is not None:  # every replica tried could not be reached
                    raise last from None
                raise
            self._sent_at = time.perf_counter()
            self.timeline = TokenTimeline()
            try:
                window = await self.parts.meter.open(
                    state.replica.device, self.timeline.since,
                    self.parts.rates.get(fw.decision.backend, TOKEN_COUNTS))
            except BaseException:
                pool.release(state)
                raise
            if window is not None and fw.key is not None:
                self._own(window, fw.key.id)
            try:
                async with state.unless_ejected():
                    self.response = await self.parts.upstream.post_again_if_reset(
                        state.replica.base + fw.path, payload)
            except UpstreamError as exc:
                if not isinstance(exc, Ejected):  # its breaker has counted it already
                    pool.report(state, ok=False)
                pool.release(state)
                await self.parts.meter.abandon(window)
                if exc.kind in ("timeout", "broken"):
                    raise  # it answered (too late, or not in HTTP): no other replica
                tried.append(state.order)
                last = UpstreamError("unavailable", exc.detail)
                continue
            except BaseException:  # cancelled (the client left) while sending
                pool.release(state)
                await shielded(self.parts.meter.abandon(window))
                raise
            self.state, self.window = state, window
            self._batch = state.outstanding
            if state.backend.max_seconds_per_token:
                self._pace_at = EARLY_PACE_TOKENS
            return

    # -- relaying --------------------------------------------------------
    async def events(self, guard: LoopGuard | None = None, relay: bool = True
                     ) -> AsyncIterator[tuple[bytes, dict[str, Any] | None]]:
        """The worker's events as they arrive. The usage event is held back in
        `usage_event` (energy is added at the end); the response's `model` is
        the configured name; a worker's error event is put in the OpenAI
        envelope; the loop guard may stop the generation. A last event the
        worker did not end with a blank line is passed on too. Not `relay`ed
        (only their JSON is read), events keep the worker's model name."""
        assert self.response is not None
        guard = guard or LoopGuard()
        splitter = sse.EventSplitter()
        async for chunk in self.response.chunks():
            try:
                events = splitter.feed(chunk)
            except sse.EventTooLarge as exc:
                self.status = "upstream_invalid"
                raise UpstreamError("broken", str(exc)) from None
            for event in events:
                out = self._take(event, relay)
                if out is None:
                    continue
                yield out[0], out[1]
                if guard.feed(out[2]):
                    break
            if guard.period is not None:
                self.worker_done_at = time.perf_counter()
                self.status = "loop_stopped"
                d = self.fw.decision
                self.parts.metrics.stop(d.tier, d.backend, "loop")
                last = self.last_chunk()
                yield sse.encode(last), last
                return
        self.worker_done_at = time.perf_counter()
        tail = splitter.rest().rstrip(b"\r\n")
        if tail.strip():
            out = self._take(tail + b"\n\n", relay)
            if out is not None:
                yield out[0], out[1]

    def _take(self, event: bytes, relay: bool
              ) -> tuple[bytes, dict[str, Any] | None, str] | None:
        """One worker event: what to pass on (bytes, its JSON, its text), or None
        for what is held back or dropped. Counts tokens as they come."""
        obj = sse.event_json(event)
        if obj is None:
            return (event, None, "") if sse.is_passable(event) else None
        if obj.get("usage"):
            if not obj.get("choices"):
                self.usage_event = obj
                return None
            # llama.cpp's /v1/completions puts the usage on its last chunk,
            # beside that chunk's choices: kept as the usage event (sent at
            # the end with energy, to clients that asked), the chunk without it
            usage = obj["usage"]
            obj = {k: v for k, v in obj.items() if k != "usage"}
            self.usage_event = {**obj, "choices": [], "usage": usage}
            event = sse.encode(obj)
        if "error" in obj:
            self.status = "upstream_error_event"
            err = _error_envelope(obj["error"])
            return sse.encode(err), err, ""
        if self._inline is not None and self._inline.feed(obj):
            event = sse.encode(obj)  # a think span the engine left in the content
        try:
            text = chunk_text(obj)
        except ValueError as exc:
            self.status = "upstream_invalid"
            raise UpstreamError("broken", str(exc)) from None
        if text:
            self.decode += 1
            if self._reasons and chunk_thinks(obj):
                self.thinking += 1
            self.timeline.mark(self.fw.prompt_tokens_estimate, self.decode)
            self._last = obj
            if self.decode == self._pace_at:
                self._report_pace()
        return (self._renamed(event, obj) if relay else event), obj, text

    def _report_pace(self) -> None:
        """The answer's pace so far to its replica: the latency bound's
        measurement (app/upstream/pace.py)."""
        pace = self.timeline.decode_s_per_token()
        if pace is not None and self.state is not None:
            self.parts.pool.paced(self.state, self._batch, pace)

    def failed(self, status: str) -> None:
        """How the request ended, when it did not end well (the metrics' status
        label; the replica's breaker counts the faults among them)."""
        self.status = status

    def answered_whole(self, answer: dict[str, Any], prompt_estimate: int) -> tuple[int, int]:
        """A worker's whole (non-streamed) JSON answer: its usage is the
        exchange's, its tokens marked on the timeline; (prompt, completion)."""
        usage = answer.get("usage")
        self.usage_event = {"usage": usage} if isinstance(usage, dict) else None
        tokens = usage_tokens(usage, prompt_estimate, 0)
        mark_whole(self.timeline, answer, *tokens)
        return tokens

    def renamed(self, obj: dict[str, Any]) -> dict[str, Any]:
        """`obj` with the configured model name (workers report file paths)."""
        if self.fw.model_name and "model" in obj:
            obj["model"] = self.fw.model_name
        return obj

    def _renamed(self, event: bytes, obj: dict[str, Any]) -> bytes:
        worker_model = obj.get("model")
        name = self.fw.model_name
        if not name or not isinstance(worker_model, str) or worker_model == name:
            return event
        obj["model"] = name
        if self._rename is None or self._rename[0] != worker_model:  # once per stream
            self._rename = (worker_model, b'"model":' + json.dumps(worker_model).encode(),
                            b'"model":' + json.dumps(name).encode())
        _, old, new = self._rename
        if old in event:
            return event.replace(old, new, 1)
        return sse.encode(obj)  # the worker's JSON is spelled differently

    def last_chunk(self) -> dict[str, Any]:
        return self.renamed(loop_chunk(self._last))

    # -- the single exit ---------------------------------------------------
    async def __aenter__(self) -> Exchange:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if isinstance(exc, asyncio.CancelledError):
            self.status = "client_disconnected"
        elif isinstance(exc, UpstreamError):
            self.status = f"upstream_{exc.kind}"
        elif exc is not None and self.status == "ok":
            self.status = "error"
        await shielded(self.end())

    @property
    def sent_at(self) -> float:
        """When the worker was called (time.perf_counter())."""
        return self._sent_at

    def overhead_s(self, out_s: float) -> float:
        """The gateway's own time in this request: from its arrival to the
        worker call, and from the worker's last byte to `out_s` (a
        time.perf_counter(): the response leaving)."""
        prior = self.fw.prior.worker_s if self.fw.prior is not None else 0.0
        before = max(0.0, self._sent_at - self.fw.received_at - prior)
        done = self.worker_done_at
        return before + (max(0.0, out_s - done) if done is not None else 0.0)

    def _own(self, window: str, key_id: str) -> None:
        remember(self.parts.owners, window, key_id)

    async def end(self) -> EnergyFigure | None:
        """Release everything, once; returns the (provisional) energy figure.
        The rest of the request's bookkeeping (metrics, token budgets, its
        usage row) runs right after, once the response is on its way: the
        client does not wait for it."""
        if self._ended:
            return self.figure
        self._ended = True
        p, fw = self.parts, self.fw
        usage = self.usage_event.get("usage") if self.usage_event else None
        prompt, completion = usage_tokens(usage, fw.prompt_tokens_estimate, self.decode)
        if self.response is not None:
            await self.response.aclose()
        if self.state is not None:
            if self.status != "client_disconnected":
                p.pool.report(self.state, ok=self.status not in _REPLICA_FAULTS)
            p.pool.release(self.state)
        if prompt != fw.prompt_tokens_estimate:
            self.timeline.scale_prompt(prompt)
        self.timeline.mark(prompt, completion)
        figure = await p.meter.close(self.window, self.timeline.points())
        self.figure = plus_prior(figure, fw.prior)
        ended_s = time.perf_counter()
        if not isinstance(usage, dict):  # ended before the worker's usage chunk
            usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                     "total_tokens": prompt + completion}
        if self.thinking:
            usage = with_thinking(usage, self.thinking)
        self.usage = usage
        row = None
        if self.count:  # on disk before the answer leaves: a kill -9 loses no row
            row = self._row(prompt, completion, ended_s, cached_tokens(usage))
            try:
                p.on_answered(row)
            except Exception:
                log.exception("journaling %s", self.window)
        asyncio.get_running_loop().call_soon(self._record, prompt, completion, ended_s, row)
        return self.figure

    def _row(self, prompt: int, completion: int, ended_s: float, cached: int | None
             ) -> UsageRow:
        fw, d, fig = self.fw, self.fw.decision, self.figure
        return UsageRow(
            time.time(), fw.key.id if fw.key else None, fw.key.name if fw.key else None,
            fw.route, d.tier, d.backend, d.strategy, d.category, self.status, prompt,
            completion, fig.net_j if fig else None, fig.gross_j if fig else None,
            fig.source if fig else "unavailable", ended_s - fw.received_at,
            self.window or uuid.uuid4().hex, fig.final if fig else None, fw.asked or None,
            None if d.baseline_joules is None or d.expected_joules is None
            else d.baseline_joules - d.expected_joules, cached)

    def _record(self, prompt: int, completion: int, ended_s: float,
                row: UsageRow | None) -> None:
        """Metrics, token budgets and the usage row of an ended request."""
        try:
            self._book(prompt, completion, ended_s, row)
        except Exception:  # bookkeeping must not fail quietly, nor stop the loop
            log.exception("recording %s %s", self.fw.decision.backend, self.window)

    def _book(self, prompt: int, completion: int, ended_s: float,
              row: UsageRow | None) -> None:
        p, fw, d = self.parts, self.fw, self.fw.decision
        if self.count:
            p.metrics.request(d.tier, d.backend, fw.route, d.category, self.status)
            if self.status == "ok":
                prior = fw.prior.completion_tokens if fw.prior else 0
                p.on_complete(d, completion + prior, self.thinking + prior)
        upstream_s = ended_s - self._sent_at
        p.metrics.observe_upstream(d.tier, d.backend, upstream_s)
        if self._pace_at and self.status == "ok":
            self._report_pace()
        p.metrics.tokens(d.tier, d.backend, prompt, completion)
        if fw.stream and self.count:  # a whole answer's is observed as it leaves
            p.metrics.observe_overhead(self.overhead_s(ended_s))
        usage = self.usage or {}
        if fw.key is not None and self.count:  # all prompt tokens, cached or not
            total = usage.get("total_tokens")
            p.on_tokens(fw.key.id, total if isinstance(total, int) else prompt + completion)
        if self.window is None:
            if row is not None:
                p.on_usage(row)
            if self.count:
                p.on_settled(fw.hold, self.figure.net_j if self.figure else None)
        else:  # the final figure comes with the next counter step or so
            p.meter.when_final(self.window, partial(_settled, p, fw, row, self.count))
        p.meter.give_some()  # earlier requests' final figures, now that this one is out


def remember(owners: OrderedDict[str, str], window: str, key_id: str,
             limit: int = MAX_OWNERS) -> None:
    """The key that made the request of energy id `window`, the oldest of at
    most `limit` dropped."""
    if len(owners) >= limit:
        owners.popitem(last=False)
    owners[window] = key_id


def _settled(p: Parts, fw: Forward, row: UsageRow | None, count: bool,
             figure: EnergyFigure | None) -> None:
    """A request's final energy figure: record it, settle the key's joule
    hold with it, and write the request's usage row with it (without one, the
    row keeps the figure its response carried, `energy_final` false)."""
    d = fw.decision
    if figure is not None:
        p.metrics.request_energy(d.tier, d.backend, figure)
    if count:
        p.on_settled(fw.hold, figure.net_j if figure is not None
                     else row.energy_net_j if row is not None else None)
    if row is not None:
        p.on_usage(row if figure is None else row.with_figure(
            figure.net_j, figure.gross_j, figure.source, figure.final))


def _error_envelope(error: object) -> dict[str, Any]:
    """A worker's in-stream error in the OpenAI envelope."""
    msg = error.get("message") if isinstance(error, dict) else error
    return {"error": {"message": f"worker error: {msg}", "type": "upstream_error",
                      "param": None, "code": "upstream_error"}}
