"""The gateway against fake workers (the client seam): hostile input, worker
errors, failover, admission and timeouts, without waiting for real models."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.http.health import COUNTER_STALE_S
from app.tools.embedded import RunningGateway, run_gateway
from telemetry.devices import DeviceSpec, MeteredDevice
from telemetry.ledger import Ledger
from tests.app.fake_workers import (
    LARGE,
    SMALL,
    FakeWorkers,
    fake_catalog,
    hang,
    recording,
    sse_answer,
)
from tests.integration.conftest import final_energy
from tests.telemetry.fakes import SteppingCounter

MSG = [{"role": "user", "content": "hello there"}]


@pytest.fixture
def fakes() -> FakeWorkers:
    return FakeWorkers()


@pytest.fixture
def gw(fakes: FakeWorkers) -> Iterator[RunningGateway]:
    with run_gateway(fake_catalog(), fakes.seams(), health_interval_seconds=60) as g:
        yield g


def chat(gw: RunningGateway, body: dict[str, object], **kw: object) -> httpx.Response:
    return httpx.post(gw.v1 + "/chat/completions", json=body, timeout=10, **kw)  # type: ignore[arg-type]


def assert_envelope(r: httpx.Response, status: int, code: str | None = None) -> dict[str, object]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code
    return err  # type: ignore[no-any-return]


@pytest.mark.parametrize(("body", "code", "param"), [
    ({"model": "auto", "messages": MSG, "max_tokens": 10**12}, "invalid_value", "max_tokens"),
    ({"model": "small", "messages": MSG, "max_tokens": 5000}, None, "max_tokens"),
    ({"model": "auto", "messages": MSG, "max_tokens": 5000}, None, "max_tokens"),
    ({"model": "auto", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/cat.png"}}]}]}, None, "messages"),
    ({"model": "auto", "messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]},
     "unsupported_content", "messages"),
    ({"model": "auto", "messages": [{"role": "user", "content": [{"type": "hologram"}]}]},
     "invalid_value", "messages.0.content.0.type"),
    ({"model": "auto", "messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "invalid_value", "messages.0.content.0.text"),
    ({"model": "auto", "messages": [{"role": "user", "content": "a \ud800 b"}]},
     "invalid_value", "messages.0.content"),  # a worker answers 500 to a lone surrogate
    # llama.cpp fails once the JSON is complete and the end token is banned
    ({"model": "small", "messages": MSG, "json_schema": {"type": "object"},
      "ignore_eos": True}, "invalid_value", "ignore_eos"),
    ({"model": "small", "messages": MSG, "response_format": {"type": "json_object"},
      "ignore_eos": True}, "invalid_value", "ignore_eos"),
    # a malformed tool is llama.cpp's 500 ("Failed to parse tools"): the client's 400
    ({"model": "small", "messages": MSG, "tools": [{"type": "function"}]},
     "missing_required_parameter", "tools.0.function"),
    ({"model": "small", "messages": MSG, "tools": "x"}, "invalid_value", "tools"),
    ({"model": "small", "messages": MSG, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "invalid_value", "tools.0.function.parameters"),
    ({"model": "small"}, "missing_required_parameter", "messages"),
    ({"model": "small", "messages": MSG, "reasoning_format": "bogus"},  # llama.cpp: 500
     "invalid_value", "reasoning_format"),
])
def test_hostile_bodies_are_400(gw: RunningGateway, fakes: FakeWorkers,
                                body: dict[str, object], code: str | None, param: str) -> None:
    r = httpx.post(gw.v1 + "/chat/completions", content=json.dumps(body),  # escapes, as ASCII
                   headers={"content-type": "application/json"}, timeout=10)
    err = assert_envelope(r, 400, code)
    assert err["param"] == param
    assert fakes.posts_to(SMALL) + fakes.posts_to(LARGE) == 0


def test_deep_json_is_400_not_500(gw: RunningGateway) -> None:
    for depth in (40, 600, 100_000):
        raw = b'{"model":"auto","messages":' + b"[" * depth + b"]" * depth + b"}"
        r = httpx.post(gw.v1 + "/chat/completions", content=raw,
                       headers={"content-type": "application/json"})
        assert_envelope(r, 400, "json_too_deep")


def test_a_number_too_long_to_read_is_400(gw: RunningGateway) -> None:
    raw = b'{"model":"auto","messages":[{"role":"user","content":"hi"}],"seed":' \
        + b"9" * 5000 + b"}"
    r = httpx.post(gw.v1 + "/chat/completions", content=raw,
                   headers={"content-type": "application/json"})
    assert_envelope(r, 400, "invalid_json")


def test_only_json_bodies(gw: RunningGateway) -> None:
    raw = json.dumps({"model": "auto", "messages": MSG}).encode()
    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"content-type": ctype} if ctype else {}
        r = httpx.post(gw.v1 + "/chat/completions", content=raw, headers=headers)
        assert_envelope(r, 415, "unsupported_media_type")
    r = httpx.post(gw.v1 + "/chat/completions", content=raw,
                   headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200


def test_405_says_allow(gw: RunningGateway) -> None:
    r = httpx.get(gw.v1 + "/chat/completions")
    assert_envelope(r, 405, "method_not_allowed")
    assert r.headers["allow"] == "POST"


@pytest.mark.parametrize(("worker_status", "status", "code"), [
    (400, 400, "upstream_rejected"), (500, 502, "upstream_error"),
    (503, 503, "upstream_unavailable")])
def test_worker_errors_are_wrapped(gw: RunningGateway, fakes: FakeWorkers, worker_status: int,
                                   status: int, code: str) -> None:
    async def fail(request: httpx.Request) -> httpx.Response:
        return httpx.Response(worker_status, json={"error": {
            "code": worker_status, "message": "the worker says no", "type": "x"}})
    fakes.behaviour[SMALL] = fail
    r = chat(gw, {"model": "small", "messages": MSG})
    err = assert_envelope(r, status, code)
    assert "the worker says no" in str(err["message"])
    if status == 503:
        assert int(r.headers["retry-after"]) >= 1


def test_a_grammar_the_worker_fails_on_is_the_client_s_fault(gw: RunningGateway,
                                                             fakes: FakeWorkers) -> None:
    """llama.cpp reports a grammar that completed under ignore_eos as a 500
    event: the request caused it, so it is a 400, and no replica fault."""
    async def grammar_failure(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=sse_answer(
            1, error="got exception: Unexpected empty grammar stack after accepting piece"))
    fakes.behaviour[SMALL] = grammar_failure
    for _ in range(3):
        err = assert_envelope(chat(gw, {"model": "small", "messages": MSG,
                                        "grammar": 'root ::= "a"', "ignore_eos": True}),
                              400, "upstream_rejected")
        assert "grammar" in str(err["message"])
    assert httpx.get(gw.url + "/readyz").status_code == 200  # the breaker did not open


def test_worker_error_mid_stream(gw: RunningGateway, fakes: FakeWorkers) -> None:
    async def broken(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=sse_answer(2, error="out of memory"))
    fakes.behaviour[SMALL] = broken
    assert_envelope(chat(gw, {"model": "small", "messages": MSG}), 502)
    with httpx.stream("POST", gw.v1 + "/chat/completions", timeout=10,
                      json={"model": "small", "messages": MSG, "stream": True}) as r:
        events = [e for e in r.read().decode().split("\n\n") if e.strip()]
    err = json.loads(events[-2].removeprefix("data: "))["error"]
    assert set(err) == {"message", "type", "param", "code"} and "out of memory" in err["message"]
    assert events[-1] == "data: [DONE]"


def test_model_is_the_configured_name(gw: RunningGateway) -> None:
    body = chat(gw, {"model": "small", "messages": MSG, "max_tokens": 2}).json()
    assert body["model"] == "tiny-small"
    with httpx.stream("POST", gw.v1 + "/chat/completions", timeout=10, json={
            "model": "small", "messages": MSG, "stream": True,
            "stream_options": {"include_usage": True}}) as r:
        text = r.read().decode()
    assert "tiny-small.gguf" not in text and '"model":"tiny-small"' in text


def test_energy_ids_cannot_be_guessed(gw: RunningGateway) -> None:
    ids = [chat(gw, {"model": "small", "messages": MSG}).headers["x-joulegate-energy-id"]
           for _ in range(3)]
    tails = [i.split("/", 1)[1] for i in ids]
    assert len(set(tails)) == 3 and all(len(t) >= 21 for t in tails)  # >= 126 bits


def test_unmet_joule_cap_is_reported(gw: RunningGateway) -> None:
    headers = {"x-joulegate-max-joules": "1e-9"}
    r = chat(gw, {"model": "auto", "messages": MSG}, headers=headers)
    assert r.status_code == 200 and r.headers["x-joulegate-joule-cap"] == "unmet"
    d = httpx.post(gw.v1 + "/route", json={"model": "auto", "messages": MSG},
                   headers=headers).json()
    assert d["joule_cap_met"] is False and "cap" in d["reason"]
    r = chat(gw, {"model": "auto", "messages": MSG}, headers={"x-joulegate-max-joules": "1e9"})
    assert "x-joulegate-joule-cap" not in r.headers


def test_auto_fails_over_from_a_dead_tier(gw: RunningGateway, fakes: FakeWorkers) -> None:
    fakes.down.add(SMALL)
    cheap = {"x-joulegate-policy": "min-energy"}  # picks the small tier
    r = chat(gw, {"model": "auto", "messages": MSG}, headers=cheap)
    assert r.status_code == 200 and r.headers["x-joulegate-tier"] == "large"
    assert r.headers["x-joulegate-degraded"] == "small:direct unavailable"
    for _ in range(4):  # (the learned lengths may now make large the cheapest)
        r = chat(gw, {"model": "auto", "messages": MSG}, headers=cheap)
        assert r.status_code == 200 and r.headers["x-joulegate-tier"] == "large"
    for _ in range(2):  # refused connections: the third failure opens the breaker
        forced = chat(gw, {"model": "small", "messages": MSG})
        assert_envelope(forced, 503, "no_healthy_worker")
        assert int(forced.headers["retry-after"]) >= 1
    ready = httpx.get(gw.url + "/readyz").json()
    assert ready["degraded"] == ["small"] and ready["ready"] is True


def test_route_avoids_an_ejected_tier(gw: RunningGateway) -> None:
    pool = gw.app.state.gateway.planner.pool
    small = next(s for s in pool.all_states() if s.replica.base == SMALL)
    for _ in range(3):
        pool.report(small, ok=False)
    d = httpx.post(gw.v1 + "/route", json={"model": "auto", "messages": MSG},
                   headers={"x-joulegate-policy": "min-energy"}).json()
    assert d["tier"] == "large" and d["degraded"] == "small:direct"
    assert "degraded" in d["reason"]


def test_dropped_connection_is_retried_and_does_not_count(
        gw: RunningGateway, fakes: FakeWorkers) -> None:
    calls = {"n": 0}

    async def stale_once(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            raise httpx.RemoteProtocolError("Server disconnected", request=request)
        return await sse_ok(request)
    fakes.behaviour[SMALL] = stale_once
    assert chat(gw, {"model": "small", "messages": MSG}).status_code == 200
    assert calls["n"] == 2
    states = gw.app.state.gateway.planner.pool.all_states()
    state = next(s for s in states if s.replica.base == SMALL)
    assert state.breaker.failures == 0 and state.breaker.state == "closed"


async def sse_ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, content=sse_answer(2))


def test_overload_is_a_fast_429_and_health_stays_up(fakes: FakeWorkers) -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(1.0)
        return await sse_ok(request)
    fakes.behaviour[SMALL] = slow
    catalog = fake_catalog()
    small = catalog.backends[0].model_copy(update={
        "max_queue": 1, "replicas": [catalog.backends[0].replicas[0].model_copy(
            update={"max_concurrency": 1})]})
    catalog = catalog.model_copy(update={"backends": [small, catalog.backends[1]]})
    with run_gateway(catalog, fakes.seams(), health_interval_seconds=60) as g, \
            concurrent.futures.ThreadPoolExecutor(6) as pool:
        # One request first: what a gateway's first request pays once (lazy
        # imports, first validations) is not what a refusal costs.
        assert chat(g, {"model": "large", "messages": MSG}).status_code == 200

        def one(_: int) -> tuple[int, float, str | None]:
            start = time.perf_counter()
            r = chat(g, {"model": "small", "messages": MSG})
            return r.status_code, time.perf_counter() - start, r.headers.get("retry-after")
        futures = [pool.submit(one, i) for i in range(5)]
        time.sleep(0.3)
        health_s = []
        with httpx.Client() as probe:
            for _ in range(5):
                t0 = time.perf_counter()
                assert probe.get(g.url + "/healthz").status_code == 200
                health_s.append(time.perf_counter() - t0)
        assert sorted(health_s)[2] < 0.1, health_s
        results = [f.result() for f in futures]
    ok = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 429]
    assert len(ok) == 2 and len(refused) == 3, results
    assert all(s < 0.5 and ra == "1" for _, s, ra in refused), results


def test_hung_worker_first_byte_timeout(fakes: FakeWorkers) -> None:
    fakes.behaviour[SMALL] = hang
    with run_gateway(fake_catalog(), fakes.seams(), health_interval_seconds=60,
                     first_byte_timeout_seconds=0.3) as g:
        start = time.perf_counter()
        assert_envelope(chat(g, {"model": "small", "messages": MSG}), 504, "upstream_timeout")
        assert time.perf_counter() - start < 2


def test_openapi_declares_every_body(gw: RunningGateway) -> None:
    doc = httpx.get(gw.url + "/openapi.json").json()
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/route"):
        op = doc["paths"][path]["post"]
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        assert "model" in schema["properties"]
        assert {"400", "429", "503"} <= set(op["responses"])
    assert "Message" in doc["components"]["schemas"] and "Error" in doc["components"]["schemas"]


def test_route_shows_complexity_candidates_and_target(gw: RunningGateway) -> None:
    body = {"model": "auto", "messages": MSG}
    d = httpx.post(gw.v1 + "/route", json=body,
                   headers={"x-joulegate-quality-target": "0.9"}).json()
    assert 0 <= d["complexity"] <= 1 and d["quality_target"] == 0.9
    assert len(d["candidates"]) == 4
    assert set(d["candidates"][0]) == {"tier", "backend", "strategy", "thinking_budget",
                                       "expected_quality", "expected_joules",
                                       "completion_tokens", "thinking_tokens", "pricing"}
    bad = httpx.post(gw.v1 + "/route", json=body, headers={"x-joulegate-quality-target": "2"})
    assert_envelope(bad, 400)


def test_last_event_without_a_blank_line_is_not_lost(gw: RunningGateway,
                                                     fakes: FakeWorkers) -> None:
    async def unterminated(request: httpx.Request) -> httpx.Response:
        body = sse_answer(2, prompt_tokens=11).removesuffix(b"data: [DONE]\n\n")
        return httpx.Response(200, content=body.rstrip(b"\n"))
    fakes.behaviour[SMALL] = unterminated
    r = chat(gw, {"model": "small", "messages": MSG})
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == 11  # the worker's, from its last event


def test_the_traffic_routes_take_the_direct_path_with_the_same_errors(
        gw: RunningGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.http.asgi import DIRECT, GatewayApp

    app = gw.app
    assert isinstance(app, GatewayApp) and set(app.direct) == set(DIRECT)
    assert chat(gw, {"model": "small", "messages": MSG}).status_code == 200
    assert_envelope(httpx.post(gw.v1 + "/chat/completions", content=b"{", timeout=10,
                               headers={"content-type": "application/json"}), 400)
    assert_envelope(httpx.post(gw.v1 + "/completions", json={"model": "nope", "prompt": "x"},
                               timeout=10), 404, "model_not_found")
    wrong = httpx.get(gw.v1 + "/chat/completions", timeout=10)  # FastAPI's path
    assert_envelope(wrong, 405) and "POST" in wrong.headers["allow"]

    async def broken(request: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setitem(app.direct, "/v1/chat/completions", broken)
    err = assert_envelope(chat(gw, {"model": "small", "messages": MSG}), 500)
    assert err["type"] == "server_error" and "RuntimeError" in str(err["message"])


def test_a_request_without_max_tokens_gets_the_default_cap(fakes: FakeWorkers) -> None:
    """defaults.max_tokens caps every request that names none: a forced tier
    gets it, `auto` no more than it (a worker would run to its context)."""
    sent: list[dict[str, Any]] = []
    fakes.behaviour[SMALL] = fakes.behaviour[LARGE] = recording(sent)
    with run_gateway(fake_catalog(max_tokens=40), fakes.seams(),
                     health_interval_seconds=60) as g:
        for model in ("small", "large", "auto"):
            assert chat(g, {"model": model, "messages": MSG}).status_code == 200
        assert chat(g, {"model": "small", "messages": MSG, "max_tokens": 77}).status_code == 200
    assert [b["max_tokens"] for b in sent[:3]] == [40, 40, 40]
    assert sent[3]["max_tokens"] == 77


def test_the_docs_work_offline(gw: RunningGateway) -> None:
    page = httpx.get(gw.url + "/docs")
    assert page.status_code == 200 and "swagger-ui-bundle.js" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # no CDN
    assert httpx.get(gw.url + "/docs/assets/swagger-ui-bundle.js").status_code == 200
    root = httpx.get(gw.url + "/")
    assert root.status_code == 307 and root.headers["location"] == "/docs"


def test_a_worker_answering_garbage_is_failed_over_and_ejected(fakes: FakeWorkers) -> None:
    async def garbage(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"\x00 not an answer \xff",
                              headers={"content-type": "text/event-stream"})

    fakes.behaviour[SMALL] = garbage
    cheapest = {"x-joulegate-policy": "min-energy"}  # auto would pick the small tier
    with run_gateway(fake_catalog(), fakes.seams(), health_interval_seconds=0.2) as g:
        r = chat(g, {"model": "auto", "messages": MSG}, headers=cheapest)
        assert r.status_code == 200 and r.headers["x-joulegate-tier"] == "large", r.text
        while fakes.posts_to(SMALL) < 3:  # the small tier by name: no other backend
            assert_envelope(chat(g, {"model": "small", "messages": MSG}), 502)
        assert_envelope(chat(g, {"model": "small", "messages": MSG}), 503)  # ejected
        time.sleep(1.0)  # its health probes answer meanwhile: it stays out
        assert_envelope(chat(g, {"model": "small", "messages": MSG}), 503)
        assert httpx.get(g.url + "/readyz").json()["degraded"] == ["small"]
        r = chat(g, {"model": "auto", "messages": MSG}, headers=cheapest)
        assert r.status_code == 200 and r.headers["x-joulegate-tier"] == "large"
        assert fakes.posts_to(SMALL) == 3


def test_one_length_cap_reaches_the_worker(fakes: FakeWorkers) -> None:
    """n_predict (llama.cpp's, which wins over max_tokens there) and
    max_completion_tokens become one max_tokens: the smallest asked."""
    sent: list[dict[str, Any]] = []
    fakes.behaviour[SMALL] = fakes.behaviour[LARGE] = recording(sent)
    with run_gateway(fake_catalog(), fakes.seams(), health_interval_seconds=60) as g:
        for extra in ({"max_tokens": 3, "n_predict": 3000},
                      {"max_completion_tokens": 1, "max_tokens": 2_000_000_000},
                      {"n_predict": 5}):
            assert chat(g, {"model": "small", "messages": MSG, **extra}).status_code == 200
        r = httpx.post(g.v1 + "/completions", timeout=10, json={
            "model": "small", "prompt": "hi", "max_tokens": 9, "n_predict": 4000})
        assert r.status_code == 200
        assert_envelope(chat(g, {"model": "small", "messages": MSG, "n_predict": -1}), 400)
        for hostile in ({"prompt": ["a", "b"]}, {"prompt": "a", "n_cmpl": 4}):
            r = httpx.post(g.v1 + "/completions", timeout=10, json={"model": "small", **hostile})
            assert_envelope(r, 400)
    assert [b["max_tokens"] for b in sent] == [3, 1, 5, 9]
    assert not any("n_predict" in b or "max_completion_tokens" in b for b in sent)


def test_slow_bodies_hold_no_capacity_and_are_cut_off(fakes: FakeWorkers) -> None:
    """Connections that send their body slowly (or less of it than they said)
    are not counted against admission, and get a 408 at the deadline."""
    import socket

    catalog = fake_catalog()
    tight = catalog.with_backends([b.model_copy(update={  # room for 2 requests in all
        "max_queue": 0, "replicas": [r.model_copy(update={"max_concurrency": 1})
                                     for r in b.replicas]}) for b in catalog.backends])
    with run_gateway(tight, fakes.seams(), health_interval_seconds=60,
                     body_timeout_seconds=1.0) as g:
        port = int(g.url.rsplit(":", 1)[1])
        slow = []
        for _ in range(40):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                      b"content-type: application/json\r\ncontent-length: 500\r\n\r\n{\"mo")
            slow.append(s)
        started = time.monotonic()
        assert chat(g, {"model": "small", "messages": MSG}).status_code == 200
        assert time.monotonic() - started < 1.0  # served while the slow bodies wait
        for s in slow:
            s.settimeout(5)
            head = s.recv(4096)
            assert head.startswith(b"HTTP/1.1 408"), head[:80]
            s.close()


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_and_endless_events_end_in_the_envelope(fakes: FakeWorkers,
                                                         stream: bool) -> None:
    """Events whose choices are no list, and one event of more than 1 MiB:
    a 502 in the envelope, or, once a stream has sent an event, a stream
    that ends with an error event and [DONE]."""
    def answering(raw: bytes | tuple[bytes, bytes]) -> object:
        async def handler(request: httpx.Request) -> httpx.Response:
            async def chunks() -> Any:  # the first event in a chunk of its own
                for part in raw:
                    yield part
            content = chunks() if isinstance(raw, tuple) else raw
            return httpx.Response(200, content=content,
                                  headers={"content-type": "text/event-stream"})
        return handler

    first = sse_answer(2).split(b"\n\n")[0] + b"\n\n"  # one good event
    bad = {"malformed": b'data: {"choices": 5}\n\n' + sse_answer(2),
           "endless": b"data: " + b"x" * (2 * 1024 * 1024),
           "malformed later": first + b'data: {"choices": 5}\n\n',
           "endless later": (first, b"data: " + b"x" * (2 * 1024 * 1024))}
    with run_gateway(fake_catalog(), fakes.seams(), health_interval_seconds=60) as g:
        for name, raw in bad.items():
            for state in g.app.state.gateway.planner.pool.all_states():
                state.breaker.success()  # each case on a closed breaker
            fakes.behaviour[SMALL] = answering(raw)  # type: ignore[assignment]
            r = chat(g, {"model": "small", "messages": MSG, "stream": stream})
            if not stream or "later" not in name:  # nothing sent yet: a whole error
                assert_envelope(r, 502)
                continue
            assert r.status_code == 200
            events = [e for e in r.text.split("\n\n") if e.strip()]
            assert events[-1] == "data: [DONE]"
            assert json.loads(events[-2].removeprefix("data: "))["error"]["code"]


def test_the_guard_refuses_foreign_hosts_encoded_slashes_and_header_floods(
        gw: RunningGateway) -> None:
    ok = {"model": "small", "messages": MSG}
    assert chat(gw, ok).status_code == 200  # Host 127.0.0.1:<port>
    assert chat(gw, ok, headers={"host": "localhost:8000"}).status_code == 200
    assert_envelope(chat(gw, ok, headers={"host": "evil.example:8000"}), 421,
                    "host_not_allowed")  # a DNS-rebinding page's name
    r = httpx.post(gw.v1 + "/chat%2Fcompletions", json=ok)
    assert_envelope(r, 404)
    flood = {f"x-h{i}": "v" for i in range(150)}
    assert_envelope(chat(gw, ok, headers=flood), 431, "headers_too_large")
    assert httpx.get(gw.url + "/healthz", headers={"host": "evil.example"}).status_code == 421


def test_slow_heads_are_cut_off_at_the_deadline(fakes: FakeWorkers) -> None:
    """Slowloris: connections that send their headers a byte at a time (uvicorn
    has no deadline for them) get a 408 in the envelope and are closed; one
    that never sends a byte is closed without an answer; others are served."""
    import socket

    with run_gateway(fake_catalog(), fakes.seams(), health_interval_seconds=60,
                     head_timeout_seconds=1.0) as g:
        port = int(g.url.rsplit(":", 1)[1])
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
        for s in slow:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nx-a: ")
        silent = socket.create_connection(("127.0.0.1", port))
        started = time.monotonic()
        for _ in range(3):  # a byte every 0.4 s: each one would have reset a timer
            time.sleep(0.4)
            for s in slow:
                s.sendall(b"a")
        assert chat(g, {"model": "small", "messages": MSG}).status_code == 200
        for s in slow:
            s.settimeout(5)
            raw = b""
            while chunk := s.recv(4096):
                raw += chunk
            head, _, body = raw.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408"), head[:80]
            assert json.loads(body)["error"]["code"] == "head_timeout"
            s.close()
        assert time.monotonic() - started < 4
        silent.settimeout(5)
        assert silent.recv(4096) == b""  # closed, no answer to a request never sent
        silent.close()
        # a kept-alive connection between requests is not cut off by the head deadline
        with httpx.Client() as client:
            for _ in range(2):
                r = client.post(g.v1 + "/chat/completions", json={"model": "small",
                                                                   "messages": MSG})
                assert r.status_code == 200
                time.sleep(1.2)


def _read_all(s: Any) -> bytes:
    s.settimeout(5)
    raw = b""
    while chunk := s.recv(4096):
        raw += chunk
    return raw


def test_connections_beyond_the_caps_are_told_and_closed(fakes: FakeWorkers) -> None:
    """max_connections_per_client and max_connections: a connection beyond a
    cap gets 429 / 503 in the envelope with Retry-After, its request is not
    served, and it is closed; closing connections makes room again."""
    import socket

    with run_gateway(fake_catalog(), fakes.seams(), health_interval_seconds=60,
                     max_connections_per_client=3) as g:
        port = int(g.url.rsplit(":", 1)[1])
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        time.sleep(0.2)  # accepted
        extra = socket.create_connection(("127.0.0.1", port))
        extra.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                      b"content-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
        head, _, body = _read_all(extra).partition(b"\r\n\r\n")
        extra.close()
        assert head.startswith(b"HTTP/1.1 429") and b"retry-after: 1" in head.lower(), head
        assert json.loads(body)["error"]["code"] == "too_many_connections_from_client"
        for s in held:
            s.close()
        time.sleep(0.2)
        assert chat(g, {"model": "small", "messages": MSG}).status_code == 200  # room again
    with run_gateway(fake_catalog(), fakes.seams(), health_interval_seconds=60,
                     max_connections=2) as g:
        port = int(g.url.rsplit(":", 1)[1])
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", port))
        head, _, body = _read_all(extra).partition(b"\r\n\r\n")  # told without asking
        extra.close()
        assert head.startswith(b"HTTP/1.1 503"), head
        assert json.loads(body)["error"]["code"] == "too_many_connections"
        for s in held:
            s.close()
        time.sleep(0.2)
        assert chat(g, {"model": "small", "messages": MSG}).status_code == 200


def test_what_is_not_http_gets_the_envelope(gw: RunningGateway) -> None:
    import socket

    port = int(gw.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GARBAGE / NOT-HTTP\r\n\r\n")
        s.settimeout(5)
        raw = b""
        while chunk := s.recv(4096):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head
    assert json.loads(body)["error"]["code"] == "malformed_http"


def test_one_key_cannot_hold_every_slot_while_another_waits(
        fakes: FakeWorkers, tmp_path: Any) -> None:
    """Key A keeps the gateway full with long requests, sending a new one as
    each ends; key B, refused once by the full gateway, gets in as A is held
    to its share (before: B got 429 for as long as A kept sending)."""
    from app.tenancy.keys import KeyStore

    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.3)
        return httpx.Response(200, content=sse_answer(3),
                              headers={"content-type": "text/event-stream"})

    fakes.behaviour[SMALL] = slow
    catalog = fake_catalog()
    tight = catalog.with_backends([b.model_copy(update={  # 4 slots, no queue
        "max_queue": 0, "replicas": [r.model_copy(update={"max_concurrency": 2})
                                     for r in b.replicas]}) for b in catalog.backends])
    database = f"sqlite:///{tmp_path / 'keys.db'}"
    store = KeyStore(database)
    _, a = store.create("team-a")
    _, b = store.create("team-b")
    with run_gateway(tight, fakes.seams(), health_interval_seconds=60, state_dir=tmp_path,
                     database_url=database) as g:
        stop = time.monotonic() + 4.0

        def flood() -> list[int]:
            codes = []
            with httpx.Client(timeout=10) as c:
                while time.monotonic() < stop:
                    r = c.post(g.v1 + "/chat/completions", json={
                        "model": "small", "messages": MSG},
                        headers={"authorization": f"Bearer {a}"})
                    codes.append(r.status_code)
            return codes

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            floods = [pool.submit(flood) for _ in range(6)]
            time.sleep(0.8)  # A holds every small slot
            b_codes = []
            with httpx.Client(timeout=10) as c:
                while time.monotonic() < stop - 0.5:
                    r = c.post(g.v1 + "/chat/completions", json={
                        "model": "small", "messages": MSG},
                        headers={"authorization": f"Bearer {b}"})
                    b_codes.append(r.status_code)
                    if r.status_code == 429:
                        time.sleep(0.05)
            a_codes = [code for f in floods for code in f.result()]
        assert b_codes.count(200) >= 3, b_codes
        assert a_codes.count(200) >= 10 and 429 in a_codes
        over = [r for r in a_codes if r == 429]
        assert over  # A was told to wait its turn (key_over_share or overloaded)


class _Broken(httpx.AsyncByteStream):
    """A 200 whose body fails before its first event."""

    async def __aiter__(self) -> Any:
        raise httpx.RemoteProtocolError("peer closed connection")
        yield b""


@pytest.mark.parametrize("kind", ["garbage", "empty", "dropped"])
def test_a_stream_failing_before_its_first_event_fails_over(fakes: FakeWorkers,
                                                            kind: str) -> None:
    """Nothing reached the client yet, so `auto` sends the stream elsewhere
    (it was cut off, or streamed back as an empty success); a tier whose only
    backend failed gets a 502 in the envelope, not a 200 stream of an error."""
    async def failing(request: httpx.Request) -> httpx.Response:
        sse = {"content-type": "text/event-stream"}
        if kind == "garbage":
            return httpx.Response(200, content=b"\x00 not an answer \xff", headers=sse)
        if kind == "empty":
            return httpx.Response(200, content=b"", headers=sse)
        return httpx.Response(200, stream=_Broken(), headers=sse)

    fakes.behaviour[SMALL] = failing
    cheapest = {"x-joulegate-policy": "min-energy"}
    with run_gateway(fake_catalog(), fakes.seams(), health_interval_seconds=60) as g:
        r = chat(g, {"model": "auto", "messages": MSG, "stream": True}, headers=cheapest)
        assert r.status_code == 200 and r.headers["x-joulegate-tier"] == "large"
        assert fakes.posts_to(SMALL) == 1 and "w0" in r.text and r.text.endswith(
            "data: [DONE]\n\n")
        assert_envelope(chat(g, {"model": "small", "messages": MSG, "stream": True}), 502)


def test_requests_waiting_on_a_hung_worker_go_elsewhere(fakes: FakeWorkers) -> None:
    """A worker that takes connections and never answers (health checks
    included): the requests already waiting on it leave as soon as its
    breaker opens (two failed probes), instead of waiting out the first-byte
    timeout; a stream too."""
    fakes.hung.add(SMALL)
    cheapest = {"x-joulegate-policy": "min-energy"}
    with run_gateway(fake_catalog(), fakes.seams(), health_interval_seconds=0.3,
                     first_byte_timeout_seconds=60) as g:
        fakes.hung.discard(SMALL)
        assert chat(g, {"model": "small", "messages": MSG}).status_code == 200
        fakes.hung.add(SMALL)  # hangs from now on: a request waits on it
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            started = time.monotonic()
            waiting = [pool.submit(chat, g, {"model": "auto", "messages": MSG,
                                             "stream": stream}, headers=cheapest)
                       for stream in (False, True)]
            for f in waiting:
                r = f.result()
                assert r.status_code == 200 and r.headers["x-joulegate-tier"] == "large", \
                    r.text
            assert time.monotonic() - started < 5  # two probes, not 60 s


def test_a_failing_energy_counter_loses_no_request_and_says_so(fakes: FakeWorkers) -> None:
    """The GPU counter stops answering: requests are still answered, each
    with an energy figure (provisional: no counter step settles it), and
    /readyz and /metrics say the counter is stale; once it reads again, the
    state is ready and figures become final."""
    counter = SteppingCounter(lambda t: 250.0, time.monotonic, step_s=0.1,
                              start_t=time.monotonic())

    def gpu(spec: DeviceSpec) -> MeteredDevice:
        return MeteredDevice(spec, counter, Ledger("nvml", idle_power_w=100.0))

    seams = dataclasses.replace(fakes.seams(), device_factory=gpu)
    with run_gateway(fake_catalog(), seams, health_interval_seconds=60) as g:
        ready = httpx.get(g.url + "/readyz").json()
        assert ready["energy"] == {"cpu": "ok"} and ready["state"] == "ready"
        counter.fail = True
        time.sleep(COUNTER_STALE_S + 0.5)
        r = chat(g, {"model": "small", "messages": MSG})
        assert r.status_code == 200
        usage = r.json()["usage"]
        assert usage["energy_source"] == "nvml" and usage["energy_final"] is False
        ready = httpx.get(g.url + "/readyz")
        assert ready.status_code == 200
        assert ready.json()["energy"] == {"cpu": "stale"}
        assert ready.json()["state"] == "degraded"
        age = _metric(httpx.get(g.url + "/metrics").text,
                      "joulegate_counter_read_age_seconds")
        assert age > COUNTER_STALE_S
        counter.fail = False
        deadline = time.monotonic() + 5
        while httpx.get(g.url + "/readyz").json()["state"] != "ready":
            assert time.monotonic() < deadline, "the counter's recovery was not seen"
            time.sleep(0.1)
        r = chat(g, {"model": "small", "messages": MSG})
        fig = final_energy(g.v1, r.headers["x-joulegate-energy-id"], timeout_s=5)
        assert fig["final"] and fig["net_j"] > 0


def _metric(text: str, name: str) -> float:
    family = next(f for f in text_string_to_metric_families(text) if f.name == name)
    return float(family.samples[0].value)
