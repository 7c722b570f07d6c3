"""A reasoning model behind the gateway, on a real llama-server: the think
span comes back as `reasoning_content`, a budget that runs out closes the span
and the model answers, no thinking is the template's switch, and the
client's `reasoning_effort` bounds the budget. The worker is `tiny-think`
(workers/make_models.py): random weights, a reasoning template that opens a
think span, and single tokens for the tags, as real reasoning models have."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from app.catalog import Catalog
from tests.integration.conftest import RunningGateway, catalog_for, free_port, run_gateway
from workers.local import WorkerSpec, start_worker, stop

pytestmark = pytest.mark.integration
MATH = [{"role": "user", "content": "A train leaves at 3 pm at 60 km/h and a second one at "
                                    "4 pm at 90 km/h on the same track. When does the second "
                                    "catch up? Explain each step."}]
HELLO = [{"role": "user", "content": "Hi there!"}]
# Random weights emit the think tags at random, opening a second span mid-answer
# (llama.cpp's budget re-arms on it) or closing one early, which a trained
# reasoning model does not: sampling never picks them (tiny-think's ids 5 and
# 6); the engine's budget still forces the end tag.
NO_STRAY_TAGS = {"logit_bias": {"5": -100, "6": -100}}


def reasoning_catalog(url: str) -> Catalog:
    c = catalog_for([url], [url])
    # tiny-think's vocabulary spells words letter by letter: a short closing line
    # fits the CLOSING_TOKENS a real vocabulary's default line takes.
    return c.model_copy(update={"backends": [
        b.model_copy(update={"reasoning": True, "model": "tiny-think"}) for b in c.backends],
        "routing": c.routing.model_copy(update={"budget_message": " Time is up."})})


@pytest.fixture(scope="module")
def thinker(llama_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    spec = WorkerSpec("think", "tiny-think", free_port(), ctx=8192)
    proc = start_worker(spec, Path(llama_bin), tmp_path_factory.mktemp("logs"))
    try:
        yield f"http://127.0.0.1:{spec.port}"
    finally:
        stop([proc])


@pytest.fixture(scope="module")
def gw(thinker: str) -> Iterator[RunningGateway]:
    with run_gateway(reasoning_catalog(thinker)) as g:
        yield g


def test_a_budget_that_runs_out_closes_the_span_and_answers(gw: RunningGateway) -> None:
    client = openai.OpenAI(base_url=gw.v1, api_key="unused")
    r = client.chat.completions.create(
        model="large", messages=MATH, max_tokens=20,  # type: ignore[arg-type]
        extra_body={"thinking_budget_tokens": 16, "ignore_eos": True, **NO_STRAY_TAGS})
    message = r.choices[0].message
    thinking = message.model_extra["reasoning_content"]  # type: ignore[index]
    assert thinking.endswith("Time is up.")  # the closing line, inside the span
    assert message.content and "</think>" not in message.content
    assert "<think>" not in thinking and "</think>" not in thinking
    usage = r.usage
    assert usage is not None
    reasoning = usage.completion_tokens_details.reasoning_tokens  # type: ignore[union-attr]
    assert 16 <= reasoning < usage.completion_tokens  # the span, then an answer
    assert usage.completion_tokens <= 16 + 24 + 20  # budget, closing line, max_tokens


def test_a_reasoning_model_asked_by_name_counts_its_thinking(gw: RunningGateway) -> None:
    """No budget from anyone: the model thinks as its engine lets it, and the
    usage still says how many tokens were thinking."""
    r = httpx.post(gw.v1 + "/chat/completions", timeout=60, json={
        "model": "large", "messages": MATH, "max_tokens": 24, "ignore_eos": True,
        **NO_STRAY_TAGS}).json()
    thought = r["choices"][0]["message"].get("reasoning_content")
    usage = r["usage"]
    assert thought and usage["completion_tokens"] == 24
    assert usage["completion_tokens_details"]["reasoning_tokens"] == usage["thinking_tokens"]
    assert 0 < usage["thinking_tokens"] <= 24


def test_no_thinking_and_streamed_thinking(gw: RunningGateway) -> None:
    r = httpx.post(gw.v1 + "/chat/completions", timeout=60, json={
        "model": "large", "messages": MATH, "max_tokens": 12, "ignore_eos": True,
        "reasoning_effort": "none", **NO_STRAY_TAGS}).json()
    assert "reasoning_content" not in r["choices"][0]["message"]
    assert r["usage"]["completion_tokens"] == 12
    body = {"model": "large", "messages": MATH, "max_tokens": 10, "stream": True,
            **NO_STRAY_TAGS,
            "ignore_eos": True, "thinking_budget_tokens": 8,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", gw.v1 + "/chat/completions", json=body, timeout=60) as s:
        events = [json.loads(e[6:]) for e in s.read().decode().split("\n\n")
                  if e.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events if e.get("choices")]
    thought = "".join(d.get("reasoning_content") or "" for d in deltas)
    said = "".join(d.get("content") or "" for d in deltas)
    first_answer = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all(not d.get("reasoning_content") for d in deltas[first_answer:])  # span, answer
    assert thought and said and "</think>" not in said
    assert events[-1]["usage"]["thinking_tokens"] >= 8


def test_auto_chooses_a_budget_per_query_within_the_clients_effort(gw: RunningGateway
                                                                   ) -> None:
    def route(messages: list[dict[str, str]], policy: str = "max-quality",
              **kw: object) -> dict[str, object]:
        d: dict[str, object] = httpx.post(gw.v1 + "/route", json={
            "model": "auto", "messages": messages, **kw},
            headers={"x-joulegate-policy": policy}).json()
        return d

    hello, math = route(HELLO, "balanced"), route(MATH, max_tokens=64)
    assert hello["thinking_budget"] == 0  # a greeting: no thinking
    assert math["thinking_budget"] not in (0, None)  # a word problem thinks
    assert "budget" in str(math["reason"])
    budgets = {c["thinking_budget"] for c in math["candidates"]}  # type: ignore[attr-defined]
    assert budgets == {0, 256, 1024, 4096, 16384}  # no thinking, the ladder, unbounded
    low = route(MATH, max_tokens=64, reasoning_effort="low")
    assert low["thinking_budget"] in (0, 256)
    assert {c["thinking_budget"] for c in low["candidates"]} <= {0, 256}  # type: ignore[attr-defined]
    r = httpx.post(gw.v1 + "/chat/completions", timeout=120, json={
        "model": "auto", "messages": MATH, "max_tokens": 16, "ignore_eos": True,
        "reasoning_effort": "low", **NO_STRAY_TAGS})
    assert r.status_code == 200, r.text
    assert r.headers["x-joulegate-strategy"] in ("direct", "cot")
    assert int(r.headers["x-joulegate-thinking-budget"]) in (0, 256)
    usage = r.json()["usage"]
    assert usage.get("thinking_tokens", 0) <= 256 + 24


def test_a_span_the_engine_leaves_in_the_content_never_reaches_the_answer(
        gw: RunningGateway) -> None:
    # reasoning_format "none": llama-server leaves <think>...</think> in content,
    # as a vLLM without a reasoning parser does.
    for stream in (False, True):
        body = {"model": "large", "messages": MATH, "max_tokens": 12, "ignore_eos": True,
                **NO_STRAY_TAGS,
                "thinking_budget_tokens": 8, "reasoning_format": "none", "stream": stream}
        r = httpx.post(gw.v1 + "/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        if stream:
            deltas = [json.loads(e[6:])["choices"][0]["delta"] for e in r.text.split("\n\n")
                      if e.startswith("data: {") and '"choices":[{' in e]
            thought = "".join(d.get("reasoning_content") or "" for d in deltas)
            said = "".join(d.get("content") or "" for d in deltas)
        else:
            message = r.json()["choices"][0]["message"]
            thought, said = message.get("reasoning_content", ""), message["content"]
        assert thought.rstrip().endswith("Time is up.")
        assert said and "<think>" not in said and "</think>" not in said
