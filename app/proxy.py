"""Forwarding one decided request to a replica, metering it, and answering.

Workers always stream to the gateway. Streams pass the worker's events
through as they arrive; only the usage event is rewritten (to add energy),
and it is withheld when the client did not ask for usage. Clients that did
not ask to stream get one response assembled from the events (assemble.py),
so a departed client, a timeout or the loop guard can stop the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
from fastapi.responses import JSONResponse, Response, StreamingResponse

from app import sse
from app.assemble import Assembler
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
    disconnected: Callable[[], Awaitable[bool]] | None = None  # the client went away?


@dataclass
class _Run:
    """One worker stream being relayed: what has been seen of it so far."""

    prompt_guess: int
    decode: int = 0
    usage_event: dict[str, Any] | None = None
    last: dict[str, Any] | None = None
    status: str = "ok"
    guard: LoopGuard = field(default_factory=LoopGuard)


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
        # The worker streams (routes ask it to); the client gets one response.
        return await self._collect_watched(fw, sent, headers)

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

    async def _relay(self, fw: Forward, sent: _Sent, run: _Run) -> AsyncIterator[bytes]:
        """The worker's events as they arrive, unchanged; the usage event is held
        back in `run` (energy is added at the end), the loop guard applied."""
        splitter = sse.EventSplitter()
        async for chunk in sent.response.chunks():
            for event in splitter.feed(chunk):
                obj = sse.event_json(event)
                if obj is not None and obj.get("usage") and not obj.get("choices"):
                    run.usage_event = obj
                    continue
                if sse.is_done(event):
                    continue
                text = chunk_text(obj) if obj is not None else ""
                if text:
                    run.decode += 1
                    sent.timeline.mark(run.prompt_guess, run.decode)
                    run.last = obj
                yield event
                if run.guard.feed(text):
                    break
            if run.guard.period is not None:
                run.status = "loop_stopped"
                self._metrics.stop(fw.decision.tier, fw.decision.backend, "loop")
                yield sse.encode(loop_chunk(run.last))
                return
        rest = splitter.rest()
        if rest.strip():
            yield rest

    async def _close_run(self, fw: Forward, sent: _Sent, run: _Run
                         ) -> tuple[EnergyFigure | None, dict[str, Any]]:
        """Finish the request and return its energy and the usage to report."""
        usage = run.usage_event.get("usage") if run.usage_event else None
        prompt, completion = usage_tokens(usage, run.prompt_guess, run.decode)
        if prompt != run.prompt_guess:
            sent.timeline.scale_prompt(prompt)
        # Shielded: a client disconnect cancels the caller, and the replica, the
        # window and the metrics must still be closed.
        with anyio.CancelScope(shield=True):
            figure = plus_prior(await self._finish(fw, sent, run.status, prompt, completion),
                                fw.prior)
        if not isinstance(usage, dict):  # stopped before the worker's usage chunk
            usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                     "total_tokens": prompt + completion}
        add_prior_usage(usage, fw.prior)
        usage.update(energy_fields(figure))
        return figure, usage

    async def _stream(self, fw: Forward, sent: _Sent) -> AsyncIterator[bytes]:
        run = _Run(fw.prompt_tokens_estimate)
        try:
            async for event in self._relay(fw, sent, run):
                yield event
        except UpstreamError as exc:
            run.status = f"upstream_{exc.kind}"
            yield _api_error(fw.decision.backend, exc).sse_event()
        except asyncio.CancelledError:
            run.status = "client_disconnected"
            raise
        finally:
            _, usage = await self._close_run(fw, sent, run)
        if fw.client_wants_usage:
            final = run.usage_event or {**loop_chunk(run.last), "choices": []}
            final["usage"] = usage
            yield sse.encode(final)
        yield sse.DONE

    async def _collect(self, fw: Forward, sent: _Sent, headers: dict[str, str]) -> Response:
        """A non-streamed answer, assembled from the worker's stream (app/assemble.py)."""
        run = _Run(fw.prompt_tokens_estimate)
        asm = Assembler(chat=fw.path.endswith("/chat/completions"))
        try:
            async for event in self._relay(fw, sent, run):
                obj = sse.event_json(event)
                if obj is not None and isinstance(obj.get("error"), dict):
                    raise UpstreamError("broken", str(obj["error"].get("message", obj)))
                if obj is not None:
                    asm.add(obj)
        except UpstreamError as exc:
            run.status = f"upstream_{exc.kind}"
            await self._close_run(fw, sent, run)
            raise _api_error(fw.decision.backend, exc) from None
        except asyncio.CancelledError:
            run.status = "client_disconnected"
            await self._close_run(fw, sent, run)
            raise
        figure, usage = await self._close_run(fw, sent, run)
        body = asm.result(usage)
        if fw.prior is not None:
            merge_thinking(body, fw.prior)
        if figure is not None:
            headers["x-joulegate-energy-joules"] = f"{figure.net_j:.3f}"
            headers["x-joulegate-energy-source"] = figure.source
        return JSONResponse(body, headers=headers)

    async def _collect_watched(self, fw: Forward, sent: _Sent, headers: dict[str, str]
                               ) -> Response:
        """Collect, but stop the worker as soon as the client goes away."""
        task = asyncio.ensure_future(self._collect(fw, sent, headers))
        if fw.disconnected is None:
            return await task
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                return task.result()
            if await fw.disconnected():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                return Response(status_code=499)

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
