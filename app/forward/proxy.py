"""Answering a decided request: start its exchange (failing over for `auto`),
then relay, assemble or map the worker's answer.

Workers always stream to the gateway. Streams pass the worker's events
through as they arrive; only the usage event is rewritten (to add energy),
and it is withheld when the client did not ask for usage. Clients that did
not ask to stream get one response assembled from the events (assemble.py),
so a departed client, a timeout or the loop guard can stop the worker.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator
from typing import Any

from app import jsonio
from app.errors import ApiError, begin_failed, begin_status, from_upstream, upstream_rejected
from app.forward import sse
from app.forward.answer import Answer, Streamed, Whole
from app.forward.assemble import Assembler
from app.forward.exchange import Exchange, Parts
from app.forward.plan import Forward
from app.forward.planner import Planner
from app.forward.usage import add_prior_usage, energy_fields, merge_thinking
from app.forward.watch import ClientLeft, unless_left
from app.upstream.client import UpstreamError, UpstreamFault
from telemetry.timeline import EnergyFigure

log = logging.getLogger("joulegate.proxy")

MAX_ERROR_BODY_BYTES = 64 * 1024


class NoAnswer(UpstreamError):
    """A worker answered 200 but with no events (garbage, or nothing): counted
    by its replica's breaker, and failed over where the plan allows."""


class Proxy:
    def __init__(self, parts: Parts, planner: Planner) -> None:
        self.parts = parts
        self.planner = planner

    async def forward(self, fw: Forward) -> Answer:
        ex = await self.begin(fw)
        headers = response_headers(ex.fw)
        # A stream's headers leave before its answer: its overhead so far (to
        # the worker call); a whole answer's replaces it as it leaves.
        headers["x-joulegate-overhead-ms"] = _ms(ex.overhead_s(0.0))
        if ex.placement:
            headers["x-joulegate-placement"] = ex.placement
        if ex.window is not None:
            # The final figure comes ~100 ms after the end: GET /v1/energy/<id>.
            headers["x-joulegate-energy-id"] = ex.window
        assert ex.response is not None
        if ex.response.status != 200:
            return await self.upstream_error(ex, headers)
        try:
            if ex.fw.stream:
                # The background task ends the exchange even if the client left
                # before the stream was ever iterated (the generator's exit never ran).
                return Streamed(headers, await self._stream_begun(ex), ex.end)
            return await self._collect_watched(ex, headers)
        except NoAnswer as exc:
            # Nothing reached the client yet: the next plan without this backend.
            nxt = self.planner.replan(ex.fw, frozenset({ex.fw.decision.backend}))
            if nxt is None:
                raise from_upstream(ex.fw.decision.backend, exc) from None
            log.warning("%s gave no answer (%s): failing over to %s", ex.fw.decision.backend,
                        exc.detail, nxt.decision.backend)
            return await self.forward(nxt)

    async def _stream_begun(self, ex: Exchange) -> AsyncGenerator[bytes, None]:
        """The stream to relay. Where the plan may fail over (`auto`, tiers),
        its first event is awaited first: a worker that fails, answers
        nothing or is ejected before it raises NoAnswer, and the request goes
        elsewhere as if it had never been sent (nothing reached the client)."""
        events = self._stream(ex)
        if ex.fw.ask is None:
            return events
        assert ex.state is not None
        try:
            async with ex.state.unless_ejected():
                first = await anext(events)
        except NoAnswer:
            raise
        except UpstreamError as exc:  # Ejected: the wait was cut inside the stream
            ex.failed("upstream_unavailable")  # (recorded after this turn of the loop)
            await events.aclose()
            await ex.end()
            raise NoAnswer(exc.kind, exc.detail) from None
        return _after(first, events)

    async def begin(self, fw: Forward, count: bool = True) -> Exchange:
        """A started exchange. For `auto` and tiers, a backend that cannot take
        the request (down, ejected, saturated, unreachable) is replaced by the
        planner's next-best plan without it: the one place requests fail over
        between backends (among one backend's replicas, `Exchange.begin` moves on)."""
        excluded: set[str] = set()
        while True:
            ex = Exchange(self.parts, fw, count)
            try:
                await ex.begin()
                return ex
            except UpstreamFault as exc:
                reachable = isinstance(exc, UpstreamError) and exc.kind != "unavailable"
                if not reachable and fw.ask is not None:
                    excluded.add(fw.decision.backend)
                    nxt = self.planner.replan(fw, frozenset(excluded))
                    if nxt is not None:
                        log.info("%s cannot take the request (%s): failing over to %s",
                                 fw.decision.backend, type(exc).__name__, nxt.decision.backend)
                        fw = nxt
                        continue
                err = self._begin_error(fw, exc)
                if count:
                    d = fw.decision
                    self.parts.metrics.request(d.tier, d.backend, fw.route, d.category,
                                               begin_status(exc))
                raise err from None

    def _begin_error(self, fw: Forward, exc: UpstreamFault) -> ApiError:
        d, pool = fw.decision, self.parts.pool
        return begin_failed(exc, d.tier, d.backend, pool.queued(d.backend),
                            pool.retry_after_s(d.backend))

    async def upstream_error(self, ex: Exchange, headers: dict[str, str]) -> Whole:
        """A worker's non-200 answer in the OpenAI envelope: its 4xx as 400, 503
        as 503, other 5xx as 502, with the worker's message."""
        assert ex.response is not None
        status = ex.response.status
        raw = b""
        async with ex:
            ex.failed("upstream_status")
            try:
                async for chunk in ex.response.chunks():
                    raw += chunk
                    if len(raw) > MAX_ERROR_BODY_BYTES:
                        break
            except UpstreamError:
                pass
        err = upstream_rejected(ex.fw.decision.backend, status, _worker_message(raw))
        return Whole(err.status, jsonio.dumps(err.body()), {**headers, **err.headers})

    async def _stream(self, ex: Exchange) -> AsyncGenerator[bytes, None]:
        """The worker's events relayed. Before the first one, a failure (or an
        answer with none) raises NoAnswer where the plan may fail over; after
        it, or for a backend asked for by name, it ends the stream with an
        error event."""
        may_fail_over = ex.fw.ask is not None
        sent = False
        async with ex:
            try:
                async for event, _ in ex.events():
                    sent = True
                    yield event
                if not sent and ex.usage_event is None:
                    ex.failed("upstream_invalid")
                    raise NoAnswer("broken", "the worker's answer held no events")
            except UpstreamError as exc:
                ex.failed("upstream_invalid" if isinstance(exc, NoAnswer)
                          else f"upstream_{exc.kind}")
                if may_fail_over and not sent:
                    raise NoAnswer(exc.kind, exc.detail) from None
                yield from_upstream(ex.fw.decision.backend, exc).sse_event()
        if ex.fw.client_wants_usage:
            final = ex.usage_event or {**ex.last_chunk(), "choices": []}
            final["usage"] = final_usage(ex)
            yield sse.encode(ex.renamed(final))
        yield sse.DONE

    async def collect(self, ex: Exchange) -> tuple[dict[str, Any], EnergyFigure | None]:
        """A non-streamed answer, assembled from the worker's stream."""
        asm = Assembler(chat=ex.fw.path.endswith("/chat/completions"))
        seen = False
        try:
            async with ex:
                async for _, obj in ex.events(relay=False):
                    if obj is not None and isinstance(obj.get("error"), dict):
                        message = str(obj["error"].get("message", obj))
                        if client_caused(obj["error"]):
                            raise upstream_rejected(ex.fw.decision.backend, 400, message)
                        raise UpstreamError("broken", message)
                    if obj is not None:
                        try:
                            asm.add(obj)
                        except (TypeError, ValueError, AttributeError, KeyError) as exc:
                            ex.failed("upstream_invalid")  # the replica's breaker counts it
                            raise UpstreamError("broken", f"malformed event ({exc})") from None
                        seen = True
                if not seen and ex.usage_event is None:
                    ex.failed("upstream_invalid")
                    raise NoAnswer("broken", "the worker's answer held no events")
        except NoAnswer:
            raise
        except UpstreamError as exc:
            raise from_upstream(ex.fw.decision.backend, exc) from None
        body = ex.renamed(asm.result(final_usage(ex)))
        if ex.fw.prior is not None:
            merge_thinking(body, ex.fw.prior)
        return body, ex.figure

    async def _collect_watched(self, ex: Exchange, headers: dict[str, str]) -> Whole:
        """Collect, but stop the worker as soon as the client goes away."""
        try:
            body, figure = await unless_left(self.collect(ex), ex.fw.disconnected)
        except ClientLeft:
            return Whole(499, b"", {}, None)
        if figure is not None:
            headers["x-joulegate-energy-joules"] = f"{figure.net_j:.3f}"
            headers["x-joulegate-energy-source"] = figure.source
        payload = jsonio.dumps(body)
        overhead_s = ex.overhead_s(time.perf_counter())
        headers["x-joulegate-overhead-ms"] = _ms(overhead_s)
        if ex.count:
            self.parts.metrics.observe_overhead(overhead_s)
        return Whole(200, payload, headers)

    async def energy(self, window: str) -> EnergyFigure | None:
        return await self.parts.meter.result(window)

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Shutting down: the final figures of requests already answered."""
        await self.parts.meter.drain(timeout_s)


async def _after(first: bytes, rest: AsyncGenerator[bytes, None]
                 ) -> AsyncGenerator[bytes, None]:
    try:
        yield first
        async for event in rest:
            yield event
    finally:
        await rest.aclose()


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


def response_headers(fw: Forward) -> dict[str, str]:
    d = fw.decision
    headers = {
        "x-joulegate-tier": d.tier,
        "x-joulegate-backend": d.backend,
        "x-joulegate-route": fw.route,
        "x-joulegate-strategy": d.strategy,
    }
    if d.thinking_budget is not None:  # a reasoning backend: 0 is no thinking
        headers["x-joulegate-thinking-budget"] = str(d.thinking_budget)
    if d.degraded is not None:
        headers["x-joulegate-degraded"] = f"{d.degraded} unavailable"
    if d.joule_cap_met is False:
        headers["x-joulegate-joule-cap"] = "unmet"
    if fw.budget_used is not None:
        headers["x-joulegate-budget-used"] = f"{fw.budget_used:.3f}"
    if fw.hold is not None:  # what the request held of its key's joule budget
        headers["x-joulegate-energy-held"] = f"{fw.hold.joules:.4f}"
    return headers


def final_usage(ex: Exchange) -> dict[str, Any]:
    """The usage the client gets: the worker's, plus a thinking phase, plus energy."""
    usage = dict(ex.usage or {})
    add_prior_usage(usage, ex.fw.prior)
    usage.update(energy_fields(ex.figure))
    return usage


def client_caused(error: dict[str, Any]) -> bool:
    """A worker's in-stream error that the request caused: a 4xx code, or
    llama.cpp's grammar failures (it reports them as 500: a client's grammar
    that completed while `ignore_eos` forbade the end, or that no token fits)."""
    code = error.get("code")
    message = str(error.get("message", "")).lower()
    return (isinstance(code, int) and 400 <= code < 500) or "grammar" in message


def _worker_message(raw: bytes) -> str:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict):
        err = body.get("error")
        msg = err.get("message") if isinstance(err, dict) else err
        if isinstance(msg, str) and msg:
            return msg[:500]
    return raw.decode(errors="replace")[:500] or "no message"
