"""Forwarding one decided request to a replica, metering it, and answering.

Streams pass the worker's events through as they arrive; only the usage
event is rewritten (to add energy), and it is withheld when the client did
not ask for usage (the gateway always asks the worker for it, to count).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

import anyio
from fastapi.responses import JSONResponse, Response, StreamingResponse

from app import sse
from app.errors import ApiError, no_healthy_worker, upstream_failed, upstream_timeout
from app.meter import Meter
from app.pool import ReplicaPool, ReplicaState
from app.upstream import Upstream, UpstreamError, UpstreamResponse
from app.usage import (
    Prior,
    add_prior_usage,
    chunk_text,
    energy_fields,
    loop_chunk,
    mark_whole,
    merge_thinking,
    message_thinking,
    plus_prior,
    usage_tokens,
)
from router.decision import Decision
from router.loopguard import LoopGuard
from router.thinking import close_span, continuation_body, vllm_think_body
from telemetry.metrics import Metrics
from telemetry.timeline import EnergyFigure, TokenTimeline

log = logging.getLogger("joulegate.proxy")


@dataclass(frozen=True)
class Forward:
    """What to send where, and what the client asked for."""

    path: str
    body: dict[str, Any]
    decision: Decision
    route: str  # "auto" or "forced"
    stream: bool
    client_wants_usage: bool
    prompt_tokens_estimate: int
    received_at: float  # time.perf_counter() when the request arrived
    prior: Prior | None = None  # a first (thinking) request already made for this one


@dataclass
class _Sent:
    state: ReplicaState
    response: UpstreamResponse
    window: str | None
    timeline: TokenTimeline
    sent_at: float


class Proxy:
    def __init__(
        self, pool: ReplicaPool, upstream: Upstream, meter: Meter, metrics: Metrics,
        on_complete: Callable[[Decision, int], None] = lambda d, n: None,
    ) -> None:
        self._on_complete = on_complete
        self._pool = pool
        self._upstream = upstream
        self._meter = meter
        self._metrics = metrics
        self._settling: set[asyncio.Task[None]] = set()

    async def forward(self, fw: Forward) -> Response:
        sent = await self._send(fw)
        headers = {
            "x-joulegate-tier": fw.decision.tier,
            "x-joulegate-backend": fw.decision.backend,
            "x-joulegate-route": fw.route,
            "x-joulegate-strategy": fw.decision.strategy,
        }
        if sent.window is not None:
            # The final figure comes ~100 ms after the end: GET /v1/energy/<id>.
            headers["x-joulegate-energy-id"] = sent.window
        if sent.response.status != 200:
            return await self._upstream_error(fw, sent, headers)
        if fw.stream:
            return StreamingResponse(
                self._stream(fw, sent), media_type="text/event-stream", headers=headers
            )
        return await self._whole(fw, sent, headers)

    async def forward_spliced(self, fw: Forward, budget: int) -> Response:
        """Cap the think span with two requests (router/thinking.py): think for at
        most `budget` tokens, close the span, then continue to the answer."""
        thinking, prior_tokens, figure = "", (0, 0), None
        if budget > 0:
            think = replace(fw, body=vllm_think_body(fw.body, budget), stream=False,
                            path="/v1/chat/completions")
            sent = await self._send(think)
            if sent.response.status != 200:
                return await self._upstream_error(think, sent, {})
            body = await self._read_json(think, sent)
            usage = body.get("usage")
            prior_tokens = usage_tokens(usage, fw.prompt_tokens_estimate, 0)
            mark_whole(sent.timeline, body, *prior_tokens)
            figure = await self._finish(think, sent, "ok", *prior_tokens, count=False)
            thinking = message_thinking(body)
        answer = continuation_body(fw.body, close_span(thinking), fw.decision.max_tokens)
        prior = Prior(*prior_tokens, figure, thinking)
        return await self.forward(replace(fw, body=answer, prior=prior))

    async def _read_json(self, fw: Forward, sent: _Sent) -> dict[str, Any]:
        """A whole JSON response body; errors close the request and become ApiErrors."""
        try:
            raw = await sent.response.read()
        except UpstreamError as exc:
            await self._finish(fw, sent, status=f"upstream_{exc.kind}")
            raise _api_error(fw.decision.backend, exc) from None
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict):
            await self._finish(fw, sent, status="upstream_invalid")
            raise upstream_failed(fw.decision.backend, "response is not a JSON object")
        return body

    async def _send(self, fw: Forward) -> _Sent:
        last: UpstreamError | None = None
        for state in self._pool.candidates(fw.decision.backend):
            window = await self._meter.open(state.replica.device)
            timeline = TokenTimeline()
            state.outstanding += 1
            sent_at = time.perf_counter()
            try:
                response = await self._upstream.post(state.replica.base + fw.path, fw.body)
            except UpstreamError as exc:
                state.outstanding -= 1
                await self._meter.abandon(window)
                if exc.kind != "unavailable":
                    self._count(fw, f"upstream_{exc.kind}")
                    raise _api_error(fw.decision.backend, exc) from None
                self._pool.mark(state, up=False)
                last = exc
                continue
            return _Sent(state, response, window, timeline, sent_at)
        self._count(fw, "no_worker")
        log.warning("no replica of %s answered: %s", fw.decision.backend, last)
        raise no_healthy_worker(fw.decision.tier)

    async def _upstream_error(
        self, fw: Forward, sent: _Sent, headers: dict[str, str]
    ) -> Response:
        try:
            raw = await sent.response.read()
        except UpstreamError:
            raw = b""
        finally:
            await self._finish(fw, sent, status="upstream_status")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        if not (isinstance(body, dict) and isinstance(body.get("error"), dict)):
            msg = raw.decode(errors="replace")[:500] or "worker error"
            body = ApiError(sent.response.status, msg, "upstream_error").body()
        return JSONResponse(body, status_code=sent.response.status, headers=headers)

    async def _whole(self, fw: Forward, sent: _Sent, headers: dict[str, str]) -> Response:
        body = await self._read_json(fw, sent)
        usage = body.get("usage")
        prompt, completion = usage_tokens(usage, fw.prompt_tokens_estimate, 0)
        mark_whole(sent.timeline, body, prompt, completion)
        figure = plus_prior(await self._finish(fw, sent, "ok", prompt, completion), fw.prior)
        if fw.prior is not None:
            merge_thinking(body, fw.prior)
        if isinstance(usage, dict):
            add_prior_usage(usage, fw.prior)
            usage.update(energy_fields(figure))
        if figure is not None:
            headers["x-joulegate-energy-joules"] = f"{figure.net_j:.3f}"
            headers["x-joulegate-energy-source"] = figure.source
        return JSONResponse(body, headers=headers)

    async def _stream(self, fw: Forward, sent: _Sent) -> AsyncIterator[bytes]:
        splitter = sse.EventSplitter()
        decode = 0
        usage_event: dict[str, Any] | None = None
        status = "ok"
        prompt_guess = fw.prompt_tokens_estimate
        guard = LoopGuard()
        last: dict[str, Any] | None = None
        try:
            async for chunk in sent.response.chunks():
                for event in splitter.feed(chunk):
                    obj = sse.event_json(event)
                    if obj is not None and obj.get("usage") and not obj.get("choices"):
                        usage_event = obj  # held back: energy is added at the end
                        continue
                    if sse.is_done(event):
                        continue
                    text = chunk_text(obj) if obj is not None else ""
                    if text:
                        decode += 1
                        sent.timeline.mark(prompt_guess, decode)
                        last = obj
                    yield event
                    if guard.feed(text):
                        break
                if guard.period is not None:
                    status = "loop_stopped"
                    self._metrics.stop(fw.decision.tier, fw.decision.backend, "loop")
                    yield sse.encode(loop_chunk(last))
                    break
            rest = splitter.rest()
            if rest.strip() and guard.period is None:
                yield rest
        except UpstreamError as exc:
            status = f"upstream_{exc.kind}"
            yield _api_error(fw.decision.backend, exc).sse_event()
        except asyncio.CancelledError:
            status = "client_disconnected"
            raise
        finally:
            usage = usage_event.get("usage") if usage_event else None
            prompt, completion = usage_tokens(usage, prompt_guess, decode)
            if prompt != prompt_guess:
                sent.timeline.scale_prompt(prompt)
            # Shielded: a client disconnect cancels this generator, and the
            # replica, the window and the metrics must still be closed.
            with anyio.CancelScope(shield=True):
                figure = plus_prior(await self._finish(fw, sent, status, prompt, completion),
                               fw.prior)
        if fw.client_wants_usage and usage_event is None:
            # The worker was stopped (loop guard) before its usage chunk: count ourselves.
            usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                     "total_tokens": prompt + completion}
            usage_event = {**loop_chunk(last), "choices": [], "usage": usage}
        if usage_event is not None and fw.client_wants_usage and isinstance(usage, dict):
            add_prior_usage(usage, fw.prior)
            usage.update(energy_fields(figure))
            yield sse.encode(usage_event)
        yield sse.DONE

    async def _finish(
        self, fw: Forward, sent: _Sent, status: str, prompt: int = 0, completion: int = 0,
        count: bool = True,
    ) -> EnergyFigure | None:
        """Release the replica, close the energy window, record metrics (a
        thinking phase is not counted as a request of its own: count=False)."""
        await sent.response.aclose()
        sent.state.outstanding -= 1
        upstream_s = time.perf_counter() - sent.sent_at
        d = fw.decision
        sent.timeline.mark(prompt, completion)
        figure = await self._meter.close(sent.window, sent.timeline.points())
        if count:
            self._count(fw, status)
        if status == "ok" and count:
            self._on_complete(d, completion + (fw.prior.completion_tokens if fw.prior else 0))
        self._metrics.observe_upstream(d.tier, d.backend, upstream_s)
        self._metrics.tokens(d.tier, d.backend, prompt, completion)
        total_s = time.perf_counter() - fw.received_at
        self._metrics.observe_overhead(max(0.0, total_s - upstream_s))
        if sent.window is not None:
            task = asyncio.create_task(self._settle(d, sent.window))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)
        return figure

    async def _settle(self, d: Decision, window: str) -> None:
        """Wait for the final figure (the next counter step) and record it."""
        figure = await self._meter.settle(window)
        if figure is not None:
            self._metrics.request_energy(d.tier, d.backend, figure)

    async def energy(self, window: str) -> EnergyFigure | None:
        return await self._meter.result(window)

    async def drain(self) -> None:
        for task in list(self._settling):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _count(self, fw: Forward, status: str) -> None:
        d = fw.decision
        self._metrics.request(d.tier, d.backend, fw.route, d.category, status)


def _api_error(backend: str, exc: UpstreamError) -> ApiError:
    if exc.kind == "timeout":
        return upstream_timeout(backend)
    return upstream_failed(backend, exc.detail)
