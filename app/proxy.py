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


@dataclass(frozen=True)
class Prior:
    """What a spliced request's thinking phase cost and produced."""

    prompt_tokens: int
    completion_tokens: int
    figure: EnergyFigure | None
    thinking: str


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
            prior_tokens = _usage_tokens(usage, fw.prompt_tokens_estimate, 0)
            _mark_whole(sent.timeline, body, *prior_tokens)
            figure = await self._finish(think, sent, "ok", *prior_tokens, count=False)
            thinking = _message_thinking(body)
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
        prompt, completion = _usage_tokens(usage, fw.prompt_tokens_estimate, 0)
        _mark_whole(sent.timeline, body, prompt, completion)
        figure = _plus(await self._finish(fw, sent, "ok", prompt, completion), fw.prior)
        if fw.prior is not None:
            _merge_thinking(body, fw.prior)
        if isinstance(usage, dict):
            _add_prior_usage(usage, fw.prior)
            usage.update(_energy_fields(figure))
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
                    text = _chunk_text(obj) if obj is not None else ""
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
                    yield sse.encode(_loop_chunk(last))
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
            prompt, completion = _usage_tokens(usage, prompt_guess, decode)
            if prompt != prompt_guess:
                sent.timeline.scale_prompt(prompt)
            # Shielded: a client disconnect cancels this generator, and the
            # replica, the window and the metrics must still be closed.
            with anyio.CancelScope(shield=True):
                figure = _plus(await self._finish(fw, sent, status, prompt, completion),
                               fw.prior)
        if fw.client_wants_usage and usage_event is None:
            # The worker was stopped (loop guard) before its usage chunk: count ourselves.
            usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                     "total_tokens": prompt + completion}
            usage_event = {**_loop_chunk(last), "choices": [], "usage": usage}
        if usage_event is not None and fw.client_wants_usage and isinstance(usage, dict):
            _add_prior_usage(usage, fw.prior)
            usage.update(_energy_fields(figure))
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


def _chunk_text(chunk: dict[str, Any]) -> str:
    """The generated text in a stream chunk (one token per chunk on llama.cpp)."""
    out = []
    for choice in chunk.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        parts = [choice.get("text")]
        if isinstance(delta, dict):
            parts += [delta.get("content"), delta.get("reasoning_content")]
        out += [p for p in parts if isinstance(p, str) and p]
    return "".join(out)


def _loop_chunk(last: dict[str, Any] | None) -> dict[str, Any]:
    """A final chunk saying the gateway stopped a looping generation."""
    base: dict[str, Any] = {k: last[k] for k in ("id", "created", "model", "object")
                            if last is not None and k in last}
    choice: dict[str, Any] = {"index": 0, "finish_reason": "loop_detected"}
    if base.get("object") == "text_completion":
        choice["text"] = ""
    else:
        choice["delta"] = {}
    return {**base, "choices": [choice]}


def _usage_tokens(usage: object, prompt_default: int, completion_default: int) -> tuple[int, int]:
    """(prompt tokens computed, completion tokens); cached prompt tokens cost no prefill."""
    if not isinstance(usage, dict):
        return prompt_default, completion_default
    p = usage.get("prompt_tokens")
    c = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    prompt = p if isinstance(p, int) else prompt_default
    if isinstance(cached, int):
        prompt = max(0, prompt - cached)
    return prompt, c if isinstance(c, int) else completion_default


def _mark_whole(timeline: TokenTimeline, body: object, prompt: int, completion: int) -> None:
    """A non-streamed request's progress: prefill first, then decode to the end.

    llama.cpp reports `timings.predicted_ms`; where it does, decode is placed in
    the last `predicted_ms` of the request, else prefill is placed at the start.
    """
    end = timeline.elapsed_s()
    timings = body.get("timings") if isinstance(body, dict) else None
    decode_s = None
    if isinstance(timings, dict) and isinstance(timings.get("predicted_ms"), int | float):
        decode_s = min(end, float(timings["predicted_ms"]) / 1000.0)
    first = end - decode_s if decode_s is not None else 0.0
    timeline.mark(prompt, 0, offset_s=first)
    timeline.mark(prompt, completion, offset_s=end)


def _plus(figure: EnergyFigure | None, prior: Prior | None) -> EnergyFigure | None:
    """A spliced request's energy: its thinking phase plus its answer."""
    if prior is None or prior.figure is None or figure is None:
        return figure
    p = prior.figure
    return EnergyFigure(figure.net_j + p.net_j, figure.gross_j + p.gross_j, figure.source,
                        figure.final and p.final, figure.prefill_j + p.prefill_j,
                        figure.decode_j + p.decode_j)


def _add_prior_usage(usage: dict[str, Any], prior: Prior | None) -> None:
    if prior is None:
        return
    for key, extra in (("prompt_tokens", prior.prompt_tokens),
                       ("completion_tokens", prior.completion_tokens)):
        if isinstance(usage.get(key), int):
            usage[key] += extra
    if isinstance(usage.get("total_tokens"), int):
        usage["total_tokens"] += prior.prompt_tokens + prior.completion_tokens
    usage["thinking_tokens"] = prior.completion_tokens


def _message_thinking(body: dict[str, Any]) -> str:
    """The thinking a first-phase response holds (vLLM's reasoning parser puts it in
    `reasoning_content`; without one it is the content)."""
    choices = body.get("choices") or [{}]
    message = choices[0].get("message") or {} if isinstance(choices[0], dict) else {}
    text = message.get("reasoning_content") or message.get("content") or ""
    return str(text)


def _merge_thinking(body: dict[str, Any], prior: Prior) -> None:
    for choice in body.get("choices") or []:
        message = choice.get("message") if isinstance(choice, dict) else None
        if isinstance(message, dict) and not message.get("reasoning_content"):
            message["reasoning_content"] = prior.thinking


def _energy_fields(figure: EnergyFigure | None) -> dict[str, Any]:
    if figure is None:
        return {"energy_joules": None, "energy_source": "unavailable"}
    return {
        "energy_joules": round(figure.net_j, 4),
        "energy_gross_joules": round(figure.gross_j, 4),
        "energy_source": figure.source,
        "energy_final": figure.final,
    }
