"""The thinking-budget splice for vLLM-style backends, in one adapter.

Cap the think span with two requests (app/forward/thinking.py): think for at most
`budget` tokens, close the span, then continue to the answer. The first
phase is an exchange of its own (not counted as a request); its tokens and
energy are added to the answer's.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from app.errors import from_upstream, upstream_failed
from app.forward.answer import Answer
from app.forward.plan import Forward
from app.forward.proxy import Proxy, response_headers
from app.forward.thinking import close_span, continuation_body, vllm_think_body
from app.forward.usage import Prior, message_thinking
from app.upstream.client import UpstreamError
from router.thinking import CLOSING_TOKENS


async def forward_spliced(proxy: Proxy, fw: Forward, budget: int) -> Answer:
    thinking, prior_tokens, figure, worker_s = "", (0, 0), None, 0.0
    # What the body allows after thinking (app/forward/rewrite.py put the
    # budget and its closing line on top of the answer's allowance).
    total = fw.body.get("max_tokens")
    if budget > 0:
        body = dict(vllm_think_body(fw.body, budget), stream=False)
        think = replace(fw, body=body, stream=False, path="/v1/chat/completions",
                        ask=None)
        ex = await proxy.begin(think, count=False)
        assert ex.response is not None
        if ex.response.status != 200:
            return await proxy.upstream_error(ex, response_headers(fw))
        try:
            async with ex:
                answer = _json_object(await ex.response.read())
                if answer is None:
                    ex.failed("upstream_invalid")
                    raise upstream_failed(fw.decision.backend, "response is not a JSON object")
                prior_tokens = ex.answered_whole(answer, fw.prompt_tokens_estimate)
                worker_s = time.perf_counter() - ex.sent_at
        except UpstreamError as exc:
            raise from_upstream(fw.decision.backend, exc) from None
        figure = ex.figure
        thinking = message_thinking(answer)
        if prior_tokens[1] >= budget:  # cut off, not closed: say so, then close
            thinking += proxy.planner.catalog.routing.budget_message
    answer_tokens = max(1, total - budget - CLOSING_TOKENS) if isinstance(total, int) else None
    body = continuation_body(fw.body, close_span(thinking), answer_tokens)
    prior = Prior(*prior_tokens, figure, thinking, worker_s)
    return await proxy.forward(replace(fw, body=body, prior=prior))


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


async def answer(proxy: Proxy, fw: Forward) -> Answer:
    """A chat request's answer: a reasoning backend given a thinking budget
    has it counted, and a `splice` backend gets its budget in two requests
    (no thinking is one request: the template's `enable_thinking: false`)."""
    d = fw.decision
    backend = proxy.planner.catalog.backend(d.backend)
    assert backend is not None
    if backend.reasoning and d.thinking_budget:
        proxy.parts.metrics.thinking(d.tier, d.backend)
        if backend.thinking_mode == "splice":
            return await forward_spliced(proxy, fw, d.thinking_budget)
    return await proxy.forward(fw)
