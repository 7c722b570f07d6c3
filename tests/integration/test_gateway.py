"""The gateway end to end: the real openai client, real llama-server workers."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.conftest import (
    RunningGateway,
    Workers,
    catalog_for,
    final_energy,
    run_gateway,
)

pytestmark = pytest.mark.integration

MSG = [{"role": "user", "content": "hello there"}]


def client(gw: RunningGateway, **kw: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.v1, api_key="unused", max_retries=0, **kw)  # type: ignore[arg-type]


def test_chat_non_streaming_carries_energy_and_headers(gateway: RunningGateway) -> None:
    raw = client(gateway).chat.completions.with_raw_response.create(
        model="auto", messages=MSG, max_tokens=8)  # type: ignore[arg-type]
    resp = raw.parse()
    assert raw.headers["x-joulegate-tier"] in ("small", "large")
    assert raw.headers["x-joulegate-route"] == "auto"
    assert float(raw.headers["x-joulegate-energy-joules"]) >= 0
    assert resp.choices[0].message.content
    usage = resp.usage.model_dump()  # type: ignore[union-attr]
    assert usage["completion_tokens"] == 8
    assert usage["energy_source"] == "estimate"
    assert usage["energy_joules"] > 0


def test_chat_streaming_with_usage(gateway: RunningGateway) -> None:
    stream = client(gateway).chat.completions.create(
        model="small", messages=MSG, max_tokens=6, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 6
    assert usage.model_dump()["energy_joules"] > 0


def test_streaming_without_usage_withholds_it_and_ends_with_done(
        gateway: RunningGateway) -> None:
    body = {"model": "large", "messages": MSG, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", gateway.v1 + "/chat/completions", json=body) as r:
        assert r.headers["x-joulegate-tier"] == "large"
        assert r.headers["x-joulegate-route"] == "forced"
        events = [e for e in r.read().decode().split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]"
    assert not any('"usage"' in e and '"choices":[]' in e for e in events)


def test_completions_both_ways(gateway: RunningGateway, workers: Workers) -> None:
    c = client(gateway)
    r = c.completions.create(model="large", prompt="the energy of", max_tokens=5)
    assert r.choices[0].text and r.usage and r.usage.completion_tokens == 5
    # the worker's own counts (llama.cpp puts them on the last chunk, beside its
    # choices), not the gateway's estimate nor its count of events (two tokens
    # of one character come in one event)
    direct = httpx.post(workers.large + "/v1/completions", timeout=30, json={
        "prompt": "the energy of", "max_tokens": 5}).json()["usage"]
    assert r.usage.prompt_tokens == direct["prompt_tokens"]
    parts = list(c.completions.create(model="auto", prompt="one two", max_tokens=5,
                                      stream=True, stream_options={"include_usage": True}))
    assert "".join(p.choices[0].text for p in parts if p.choices)
    assert parts[-1].usage is not None


def test_models_list(gateway: RunningGateway) -> None:
    ids = {m.id for m in client(gateway).models.list()}
    assert {"auto", "small", "large", "small-llamacpp", "large-llamacpp"} <= ids


def test_route_dry_run_matches_chat(gateway: RunningGateway) -> None:
    body = {"model": "auto", "messages": MSG, "max_tokens": 4}
    decision = httpx.post(gateway.v1 + "/route", json=body).json()
    for key in ("tier", "backend", "strategy", "max_tokens", "thinking_budget", "category",
                "category_probabilities", "expected_joules", "expected_quality", "policy",
                "reason"):
        assert key in decision
    r = httpx.post(gateway.v1 + "/chat/completions", json=body, timeout=30)
    assert r.headers["x-joulegate-tier"] == decision["tier"]
    assert r.headers["x-joulegate-strategy"] == decision["strategy"]


def test_health_ready_metrics(gateway: RunningGateway) -> None:
    assert httpx.get(gateway.url + "/healthz").status_code == 200
    ready = httpx.get(gateway.url + "/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    client(gateway).chat.completions.create(model="small", messages=MSG, max_tokens=2)  # type: ignore[arg-type]
    text = httpx.get(gateway.url + "/metrics").text
    for name in ("joulegate_requests_total", "joulegate_tokens_total",
                 "joulegate_upstream_seconds_bucket", "joulegate_overhead_seconds_bucket",
                 "joulegate_backend_up", "joulegate_device_energy_joules_total"):
        assert name in text, name


def test_first_chunk_arrives_before_worker_finishes(gateway: RunningGateway) -> None:
    body = {"model": "large", "messages": MSG, "max_tokens": 300, "stream": True}
    start = time.perf_counter()
    first = None
    with httpx.stream("POST", gateway.v1 + "/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if first is None and '"content":"' in line:
                first = time.perf_counter() - start
    total = time.perf_counter() - start
    assert first is not None
    assert first < total / 3, (first, total)


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": "auto", "messages": MSG, "max_tokens": -1}, 400, "max_tokens"),
    ({"model": "auto", "messages": MSG, "temperature": 2.5}, 400, "temperature"),
    ({"model": "auto", "messages": MSG, "temperature": -0.1}, 400, "temperature"),
    ({"model": "auto"}, 400, "messages"),
    ({"messages": MSG}, 400, "model"),
    ({"model": "auto", "messages": "hi"}, 400, "messages"),
    ({"model": "auto", "messages": MSG, "stream": "yes"}, 400, "stream"),
    ({"model": "auto", "messages": [{"role": "wizard", "content": "x"}]}, 400,
     "messages.0.role"),
    ({"model": "gpt-17", "messages": MSG}, 404, "model"),
])
def test_bad_requests_get_openai_errors(gateway: RunningGateway, body: dict[str, object],
                                        status: int, param: str) -> None:
    r = httpx.post(gateway.v1 + "/chat/completions", json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"]


def test_malformed_json_and_wrong_shapes(gateway: RunningGateway) -> None:
    for raw in (b"{bad", b"[1,2]", b"", b"\xff\xfe"):
        r = httpx.post(gateway.v1 + "/chat/completions", content=raw,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400, raw
        assert r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(gateway.v1 + "/completions", json={"model": "auto", "prompt": 5})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("prompt")


def test_bad_policy_headers(gateway: RunningGateway) -> None:
    body = {"model": "auto", "messages": MSG}
    r = httpx.post(gateway.v1 + "/route", json=body, headers={"x-joulegate-policy": "cheap"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-joulegate-policy"
    r = httpx.post(gateway.v1 + "/route", json=body, headers={"x-joulegate-max-joules": "-3"})
    assert r.status_code == 400


def test_openai_client_raises_on_errors(gateway: RunningGateway) -> None:
    with pytest.raises(openai.NotFoundError):
        client(gateway).chat.completions.create(model="nope", messages=MSG)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError):
        client(gateway).chat.completions.create(model="auto", messages=MSG, max_tokens=-5)  # type: ignore[arg-type]


def test_oversized_body_is_413(workers: Workers) -> None:
    with run_gateway(catalog_for([workers.small], [workers.large]), max_body_bytes=2000) as gw:
        big = {"model": "auto", "messages": [{"role": "user", "content": "x" * 5000}]}
        r = httpx.post(gw.v1 + "/chat/completions", json=big)
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "body_too_large"

        def chunks() -> Iterator[bytes]:  # no Content-Length: refused while it arrives
            yield json.dumps(big).encode()[:1500]
            yield json.dumps(big).encode()[1500:]
        r = httpx.post(gw.v1 + "/chat/completions", content=chunks(),
                       headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_refused_replica_is_skipped(workers: Workers) -> None:
    from tests.integration.conftest import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    with run_gateway(catalog_for([dead, workers.small], [workers.large]),
                     health_interval_seconds=60) as gw:
        gw_state = gw.app.state.gateway
        for _ in range(3):
            r = client(gw).chat.completions.create(model="small", messages=MSG, max_tokens=2)  # type: ignore[arg-type]
            assert r.choices
        states = {s.replica.base: s for s in gw_state.planner.pool.all_states()}
        assert states[dead].breaker.state == "open"  # three refusals in a row
        assert states[workers.small].breaker.state == "closed"


def test_no_healthy_worker_is_503(workers: Workers) -> None:
    from tests.integration.conftest import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    with run_gateway(catalog_for([workers.small], [dead])) as gw:
        r = httpx.post(gw.v1 + "/chat/completions",
                       json={"model": "large", "messages": MSG})
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "no_healthy_worker"
        assert int(r.headers["retry-after"]) >= 1
        ready = httpx.get(gw.url + "/readyz")
        assert ready.status_code == 200 and ready.json()["tiers"]["large"] is False
        assert ready.json()["degraded"] == ["large"]


def test_worker_timeout_is_504(workers: Workers) -> None:
    # The first-byte timeout bounds a worker's queue wait and prefill: a long
    # prompt keeps the CPU worker silent (prefill) for over a second.
    long_prompt = [{"role": "user", "content": "energy " * 300}]  # ~1,800 tokens
    with run_gateway(catalog_for([workers.small], [workers.large]),
                     first_byte_timeout_seconds=0.2) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", timeout=30,
                       json={"model": "large", "messages": long_prompt, "max_tokens": 4})
        assert r.status_code == 504
        assert r.json()["error"]["type"] == "timeout"


def test_unknown_fields_are_forwarded(gateway: RunningGateway) -> None:
    # llama.cpp's own sampling option passes through the gateway untouched.
    r = httpx.post(gateway.v1 + "/chat/completions", timeout=30, json={
        "model": "small", "messages": MSG, "max_tokens": 3, "n_probs": 2, "top_k": 5})
    assert r.status_code == 200


def test_error_event_when_worker_dies_mid_stream(
        llama_bin: str, tmp_path: object) -> None:
    from pathlib import Path

    from tests.integration.conftest import free_port
    from workers.local import WorkerSpec, start_worker, stop

    spec = WorkerSpec("doomed", "tiny-large", free_port(), parallel=1)
    proc = start_worker(spec, Path(llama_bin), Path(str(tmp_path)))
    url = f"http://127.0.0.1:{spec.port}"
    try:
        with run_gateway(catalog_for([url], [url])) as gw:
            body = {"model": "large", "messages": MSG, "max_tokens": 2000, "stream": True}
            events = []
            with httpx.stream("POST", gw.v1 + "/chat/completions", json=body,
                              timeout=60) as r:
                for line in r.iter_lines():
                    if line:
                        events.append(line)
                    if len(events) == 5:
                        proc.kill()
            assert events[-1] == "data: [DONE]"
            err = json.loads(events[-2][len("data: "):])
            assert err["error"]["code"] == "upstream_error"
    finally:
        stop([proc])


def assert_worker_stops(worker: str, gw: RunningGateway, within_s: float = 5.0) -> None:
    """The worker is idle again within `within_s`, and no replica is left busy."""
    deadline = time.monotonic() + within_s
    busy = True
    while busy and time.monotonic() < deadline:
        busy = _busy(worker)
        time.sleep(0.1)
    assert not busy
    pool = gw.app.state.gateway.planner.pool
    assert all(s.outstanding == 0 for s in pool.all_states())


def wait_idle(worker: str, within_s: float = 30.0) -> None:
    """An earlier test's long request may still be running on the shared worker."""
    deadline = time.monotonic() + within_s
    while _busy(worker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _busy(worker)


def _busy(worker: str) -> bool:
    m = httpx.get(worker + "/metrics").text
    return any(ln.startswith("llamacpp:requests_processing") and not ln.endswith(" 0")
               for ln in m.splitlines())


def test_client_disconnect_cancels_upstream(workers: Workers) -> None:
    wait_idle(workers.large)
    with run_gateway(catalog_for([workers.small], [workers.large])) as gw:
        body = {"model": "large", "messages": MSG, "max_tokens": 2000, "stream": True}
        with httpx.stream("POST", gw.v1 + "/chat/completions", json=body, timeout=60) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i > 6:
                    break
        # 3000 tokens take the CPU worker many seconds; a cancelled one stops at once.
        assert_worker_stops(workers.large, gw)


def test_final_energy_can_be_fetched_after_the_response(gateway: RunningGateway) -> None:
    r = httpx.post(gateway.v1 + "/chat/completions", timeout=30,
                   json={"model": "large", "messages": MSG, "max_tokens": 16})
    fig = final_energy(gateway.v1, r.headers["x-joulegate-energy-id"])
    assert fig["final"] and fig["source"] == "estimate" and fig["net_j"] > 0
    assert httpx.get(gateway.v1 + "/energy/cpu/w999999").status_code == 404


def test_auto_routes_hard_and_easy_prompts_differently(gateway: RunningGateway) -> None:
    easy = {"model": "auto", "max_tokens": 4,
            "messages": [{"role": "user", "content": "hey, thanks a lot!"}]}
    hard = {"model": "auto", "max_tokens": 4, "messages": [{"role": "user", "content":
            "Write a Python function that parses a CSV file and computes per-column medians, "
            "with unit tests."}]}
    d_easy = httpx.post(gateway.v1 + "/route", json=easy).json()
    d_hard = httpx.post(gateway.v1 + "/route", json=hard).json()
    assert d_easy["category"] == "chat" and d_easy["tier"] == "small"
    assert d_hard["category"] == "code" and d_hard["tier"] == "large"
    for body, d in ((easy, d_easy), (hard, d_hard)):
        r = httpx.post(gateway.v1 + "/chat/completions", json=body, timeout=30)
        assert r.status_code == 200
        assert r.headers["x-joulegate-tier"] == d["tier"]
        assert r.headers["x-joulegate-strategy"] == d["strategy"]


def test_policy_header_changes_the_decision(gateway: RunningGateway) -> None:
    body = {"model": "auto", "messages": [{"role": "user", "content": "Who wrote Hamlet?"}]}
    low = httpx.post(gateway.v1 + "/route", json=body,
                     headers={"x-joulegate-policy": "min-energy"}).json()
    high = httpx.post(gateway.v1 + "/route", json=body,
                      headers={"x-joulegate-policy": "max-quality"}).json()
    assert low["tier"] == "small" and high["tier"] == "large"
    assert low["policy"] == "min-energy" and high["policy"] == "max-quality"


def test_loop_guard_stops_a_repeating_stream(gateway: RunningGateway) -> None:
    # A grammar makes the real worker repeat one phrase until max_tokens.
    body = {"model": "large", "prompt": "go", "max_tokens": 2000, "stream": True,
            "grammar": 'root ::= ("loop " )+', "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    with httpx.stream("POST", gateway.v1 + "/completions", json=body, timeout=60) as r:
        events = [e for e in r.read().decode().split("\n\n") if e.strip()]
    elapsed = time.perf_counter() - t0
    assert events[-1] == "data: [DONE]"
    stops = [json.loads(e[6:]) for e in events[:-1] if "loop_detected" in e]
    assert stops and stops[0]["choices"][0]["finish_reason"] == "loop_detected"
    usage = json.loads(events[-2][6:])["usage"]
    assert usage["completion_tokens"] < 200  # stopped long before max_tokens
    assert elapsed < 10
    metrics = httpx.get(gateway.url + "/metrics").text
    assert 'joulegate_generation_stops_total{backend="large-llamacpp",reason="loop"' in metrics


def test_non_streamed_requests_are_loop_guarded_too(gateway: RunningGateway) -> None:
    body = {"model": "large", "prompt": "go", "max_tokens": 2000,
            "grammar": 'root ::= ("loop " )+', "ignore_eos": True}
    r = httpx.post(gateway.v1 + "/completions", json=body, timeout=60)
    assert r.status_code == 200
    out = r.json()
    assert out["object"] == "text_completion"
    assert out["choices"][0]["finish_reason"] == "loop_detected"
    assert out["choices"][0]["text"].startswith("loop loop")
    assert out["usage"]["completion_tokens"] < 200 and out["usage"]["energy_joules"] >= 0


def test_non_streamed_client_that_leaves_stops_the_worker(workers: Workers) -> None:
    wait_idle(workers.large)
    with run_gateway(catalog_for([workers.small], [workers.large])) as gw:
        body = {"model": "large", "messages": MSG, "max_tokens": 2000, "ignore_eos": True}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(gw.v1 + "/chat/completions", json=body, timeout=1.0)
        # llama-server alone would generate all 2,000 tokens (many seconds) for a
        # non-streamed request whose client has gone; the gateway stops it.
        assert_worker_stops(workers.large, gw)


def test_the_gateway_says_its_own_time_and_energy(workers: Workers) -> None:
    """x-joulegate-overhead-ms: the gateway's own time (arrival to worker call,
    worker's last byte to response out), the same figure the overhead
    histogram observes; its own CPU and joules in /metrics."""
    import re

    from telemetry.metrics import FLUSH_EVERY_S

    with run_gateway(catalog_for([workers.small], [workers.large]),
                     cpu_watts_per_core=7.5) as gw:
        t0 = time.perf_counter()
        r = httpx.post(gw.v1 + "/chat/completions", timeout=60, json={
            "model": "small", "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 4})
        took_ms = 1000 * (time.perf_counter() - t0)
        assert r.status_code == 200
        overhead_ms = float(r.headers["x-joulegate-overhead-ms"])
        assert 0 < overhead_ms < took_ms
        time.sleep(3 * FLUSH_EVERY_S)
        text = httpx.get(gw.url + "/metrics").text

        def value(pattern: str) -> float:
            m = re.search(pattern, text, re.M)
            assert m is not None, pattern
            return float(m.group(1))

        assert value(r"^joulegate_overhead_seconds_count ([\d.e+-]+)$") == 1
        assert value(r"^joulegate_overhead_seconds_sum ([\d.e+-]+)$") == pytest.approx(
            overhead_ms / 1000, abs=1e-6)
        cpu_s = value(r"^joulegate_own_cpu_seconds_total ([\d.e+-]+)$")
        joules = value(r'^joulegate_own_energy_joules_total\{source="estimate"\} ([\d.e+-]+)$')
        assert cpu_s > 0 and joules == pytest.approx(7.5 * cpu_s, rel=0.05)
        with httpx.stream("POST", gw.v1 + "/chat/completions", timeout=60, json={
                "model": "small", "stream": True, "max_tokens": 4,
                "messages": [{"role": "user", "content": "Say hi."}]}) as s:
            assert float(s.headers["x-joulegate-overhead-ms"]) > 0  # to the worker call
            s.read()


def test_usage_rows_keep_the_cached_prompt_apart(workers: Workers, tmp_path: Path) -> None:
    """The same prompt twice: the worker reuses its cache, the second row's
    prompt_tokens count what was computed, and with cached_tokens they add up
    to the prompt the client's usage shows."""
    from tests.integration.test_keys import _until_rows

    admin = "jg-admin-" + "c" * 40
    h = {"authorization": f"Bearer {admin}"}
    text = "Tell me about the history of the bicycle, from its first designs onwards."
    with run_gateway(catalog_for([workers.small], [workers.large]), state_dir=tmp_path,
                     admin_key=admin) as gw:
        client = [httpx.post(gw.v1 + "/chat/completions", headers=h, timeout=60, json={
            "model": "small", "messages": [{"role": "user", "content": text}],
            "max_tokens": 4, "temperature": 0}).json()["usage"] for _ in range(2)]
        rows = _until_rows(gw.v1, admin, 2)
    first, second = sorted(rows["data"], key=lambda r: r["time"])[-2:]
    assert first["prompt_tokens"] + (first["cached_tokens"] or 0) == client[0]["prompt_tokens"]
    assert second["cached_tokens"] > 0
    assert second["prompt_tokens"] + second["cached_tokens"] == client[1]["prompt_tokens"]
    assert rows["totals"]["cached_tokens"] >= second["cached_tokens"]
