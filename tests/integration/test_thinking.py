"""Thinking budget by splicing (the vLLM way) against a real llama-server, which
speaks the same `continue_final_message` protocol."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.integration.conftest import Workers, catalog_for, run_gateway

pytestmark = pytest.mark.integration
HARD = [{"role": "user", "content": "Prove that there are infinitely many primes."}]


def splicing_catalog(workers: Workers, budget: int):  # type: ignore[no-untyped-def]
    c = catalog_for([workers.small], [workers.large])
    return c.model_copy(update={
        "backends": [b.model_copy(update={"reasoning": b.tier == "large",
                                          "thinking": "splice"}) for b in c.backends],
        "routing": c.routing.model_copy(update={"thinking_budgets": [budget],
                                                "direct_max_tokens": 24})})


def test_splice_thinks_within_budget_then_answers(workers: Workers) -> None:
    with run_gateway(splicing_catalog(workers, 8)) as gw:
        headers = {"x-joulegate-policy": "max-quality"}
        decision = httpx.post(gw.v1 + "/route", json={"model": "auto", "messages": HARD,
                                                     "thinking_budget_tokens": 8},
                              headers=headers).json()
        assert (decision["tier"], decision["strategy"]) == ("large", "cot")
        assert decision["thinking_budget"] == 8
        r = httpx.post(gw.v1 + "/chat/completions", headers=headers, timeout=60,
                       json={"model": "auto", "messages": HARD, "ignore_eos": True,
                             "thinking_budget_tokens": 8})
        assert r.status_code == 200, r.text
        body = r.json()
        usage = body["usage"]
        assert usage["thinking_tokens"] == 8  # the think span was cut at the budget
        assert usage["completion_tokens"] == 8 + 24  # thinking + the answer's cap
        assert usage["completion_tokens_details"]["reasoning_tokens"] == 8
        assert usage["energy_joules"] > 0
        assert body["choices"][0]["message"]["reasoning_content"]
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'joulegate_thinking_budget_requests_total{backend="large-llamacpp"' in metrics


def test_splice_streams_the_answer(workers: Workers) -> None:
    with run_gateway(splicing_catalog(workers, 6)) as gw:
        body = {"model": "auto", "messages": HARD, "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True}, "thinking_budget_tokens": 6}
        with httpx.stream("POST", gw.v1 + "/chat/completions", json=body, timeout=60,
                          headers={"x-joulegate-policy": "max-quality"}) as r:
            events = [e for e in r.read().decode().split("\n\n") if e.strip()]
        assert events[-1] == "data: [DONE]"
        usage = json.loads(events[-2][6:])["usage"]
        assert usage["thinking_tokens"] == 6 and usage["completion_tokens"] == 6 + 24
