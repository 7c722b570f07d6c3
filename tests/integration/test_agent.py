"""The gateway metering through a remote `joulegate agent` over HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from app.metering.meter import final_figure
from app.metering.remote import RemoteMeter
from app.upstream.client import Upstream
from app.upstream.http1 import Http1Transport
from telemetry import protocol
from telemetry.agent import AgentServer
from tests.integration.conftest import (
    Workers,
    catalog_for,
    final_energy,
    free_port,
    run_gateway,
    running_agent,
)

pytestmark = pytest.mark.integration
MSG = [{"role": "user", "content": "hello there"}]


@pytest.fixture
def agent(workers: Workers) -> Iterator[tuple[str, AgentServer]]:
    with running_agent(catalog_for([workers.small], [workers.large])) as a:
        yield a


def test_gateway_meters_through_the_agent(workers: Workers,
                                          agent: tuple[str, AgentServer]) -> None:
    url, server = agent
    with run_gateway(catalog_for([workers.small], [workers.large]), agent_url=url) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", timeout=30,
                       json={"model": "large", "messages": MSG, "max_tokens": 16})
        usage = r.json()["usage"]
        assert usage["energy_source"] == "estimate" and usage["energy_joules"] > 0
        assert usage["energy_standalone_joules"] > 0  # the curve travelled to the agent
        assert final_energy(gw.v1, r.headers["x-joulegate-energy-id"])["final"]
        time.sleep(0.5)  # the gateway records the final figure in the histogram (it polls)
        assert "joulegate_request_energy_joules_count" in httpx.get(gw.url + "/metrics").text
    ledger = server.devices["cpu"].ledger
    t = ledger.totals()
    assert t.attributed_j > 0
    assert t.attributed_j + t.idle_j + t.unattributed_j == pytest.approx(t.measured_j)
    metrics = httpx.get(url + "/metrics").text
    assert "joulegate_device_energy_joules_total" in metrics


def test_agent_rejects_bad_bodies(agent: tuple[str, AgentServer]) -> None:
    url, _ = agent
    assert httpx.post(url + "/v1/windows/open", json={"device": "nope"}).status_code == 400
    assert httpx.post(url + "/v1/windows/open", content=b"{bad").status_code == 400
    r = httpx.post(url + "/v1/windows/close", json={"device": "cpu", "window": "w424242"})
    assert r.status_code == 404


TOKEN = "agent-secret-for-tests"


def _batch(url: str, calls: list[dict[str, object]], token: str | None = TOKEN,
           gateway: str = "forger") -> httpx.Response:
    headers = {"X-Joulegate-Gateway": gateway}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.post(url + "/v1/windows/batch", json={"calls": calls}, headers=headers)


def test_a_forged_client_cannot_change_any_charge(workers: Workers) -> None:
    """The attack of the hostile pass: windows opened and closed beside real
    requests, claiming millions of tokens, took their joules (8 J -> 0.0 J).
    Without the token every window call is refused; the charges stay whole."""
    catalog = catalog_for([workers.small], [workers.large])
    with running_agent(catalog, token=TOKEN) as (url, server), \
            run_gateway(catalog, agent_url=url, agent_token=TOKEN) as gw:
        assert httpx.get(url + "/healthz").status_code == 200  # scrapers need no token
        assert httpx.get(url + "/metrics").status_code == 200
        for token in (None, "wrong"):
            r = _batch(url, [{"call": "open", "device": "cpu", "windows": ["forged1"]}], token)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            single = httpx.post(url + "/v1/windows/close", json={
                "device": "cpu", "window": "forged1", "points": [[0.1, 5_000_000, 0]]})
            assert single.status_code == 401
        r = httpx.post(gw.v1 + "/chat/completions", timeout=30,
                       json={"model": "large", "messages": MSG, "max_tokens": 16})
        fig = final_energy(gw.v1, r.headers["x-joulegate-energy-id"])
        assert fig["final"] and fig["net_j"] > 0  # the gateway's token was taken
        assert not server.devices["cpu"].ledger.is_open("forged1")


def test_a_window_belongs_to_the_gateway_that_opened_it(
        workers: Workers) -> None:
    catalog = catalog_for([workers.small], [workers.large])
    with running_agent(catalog, token=TOKEN) as (url, server):
        ledger = server.devices["cpu"].ledger
        opened = _batch(url, [{"call": "open", "device": "cpu", "windows": ["w-a", "w-b"]}],
                        gateway="gw-1").json()["results"][0]
        assert opened["body"]["windows"] == ["w-a", "w-b"]
        other = _batch(url, [{"call": "close", "device": "cpu", "window": "w-a",
                              "points": [[0.0, 10, 1]]}], gateway="gw-2")
        assert other.json()["results"][0]["status"] == 404  # another gateway's window
        assert ledger.is_open("w-a")
        # claims that cannot be true: the window closes with no work, 400
        for wid, points in (("w-a", [[0.0, 10, 5_000_000]]),   # a million answer tokens/s
                            ("w-b", [[0.0, 10, 5], [0.1, 3, 6]])):  # counts going down
            r = _batch(url, [{"call": "close", "device": "cpu", "window": wid,
                              "points": points}], gateway="gw-1")
            result = r.json()["results"][0]
            assert result["status"] == 400, result
            assert not ledger.is_open(wid)
        fine = _batch(url, [{"call": "open", "device": "cpu", "windows": ["w-c"]},
                            {"call": "close", "device": "cpu", "window": "w-c",
                             "points": [[0.0, 12, 0], [0.05, 12, 3]]}], gateway="gw-1")
        assert [x["status"] for x in fine.json()["results"]] == [200, 200]


def test_a_gateway_holds_a_bounded_number_of_open_windows(
        workers: Workers, monkeypatch: pytest.MonkeyPatch) -> None:
    import telemetry.agent

    monkeypatch.setattr(telemetry.agent, "MAX_OPEN_WINDOWS", 5)
    catalog = catalog_for([workers.small], [workers.large])
    with running_agent(catalog, token=TOKEN) as (url, _):
        names = [f"n{i}" for i in range(8)]
        got = _batch(url, [{"call": "open", "device": "cpu", "windows": names}],
                     gateway="greedy").json()["results"][0]["body"]["windows"]
        assert got == names[:5]
        other = _batch(url, [{"call": "open", "device": "cpu", "windows": ["x1"]}],
                       gateway="other").json()["results"][0]["body"]["windows"]
        assert other == ["x1"]  # one gateway's windows never starve another's
        _batch(url, [{"call": "close", "device": "cpu", "window": "n0", "points": []}],
               gateway="greedy")
        again = _batch(url, [{"call": "open", "device": "cpu", "windows": ["n8", "n9"]}],
                       gateway="greedy").json()["results"][0]["body"]["windows"]
        assert again == ["n8"]


def test_agent_down_never_fails_a_request(workers: Workers) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with run_gateway(catalog_for([workers.small], [workers.large]), agent_url=dead) as gw:
        r = httpx.post(gw.v1 + "/chat/completions", timeout=30,
                       json={"model": "small", "messages": MSG, "max_tokens": 4})
        assert r.status_code == 200
        assert r.json()["usage"]["energy_source"] == "unavailable"


def test_a_hung_agent_never_delays_an_answer(workers: Workers) -> None:
    """An agent that takes connections and never answers (SIGSTOPped, say):
    requests answer in normal time, saying their energy is unavailable."""
    import socket
    import time

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)  # accepted by the kernel, never read
    url = f"http://127.0.0.1:{hung.getsockname()[1]}"
    try:
        with run_gateway(catalog_for([workers.small], [workers.large]), agent_url=url) as gw:
            for _ in range(3):
                started = time.monotonic()
                r = httpx.post(gw.v1 + "/chat/completions", timeout=30,
                               json={"model": "small", "messages": MSG, "max_tokens": 4})
                assert r.status_code == 200
                assert time.monotonic() - started < 3.0  # it took 20 s
                assert r.json()["usage"]["energy_source"] == "unavailable"
    finally:
        hung.close()


def test_each_device_is_metered_by_the_agent_on_its_machine(workers: Workers) -> None:
    """Two machines, one agent each (as the Kubernetes DaemonSet runs them): the
    gateway sends each request's window to its own device's agent."""
    base = catalog_for([workers.small], [workers.large])
    two = base.model_copy(update={
        "devices": [base.devices[0].model_copy(update={"name": n, "host": n})
                    for n in ("node-a", "node-b")],
        "backends": [b.model_copy(update={"replicas": [r.model_copy(update={
            "device": "node-a" if b.tier == "small" else "node-b"}) for r in b.replicas]})
            for b in base.backends]})
    with running_agent(two.model_copy(update={"devices": two.devices[:1]})) as (a_url, a), \
            running_agent(two.model_copy(update={"devices": two.devices[1:]})) as (b_url, b):
        agents = {"node-a": a_url, "node-b": b_url}
        metered = two.model_copy(update={"devices": [
            d.model_copy(update={"agent": agents[d.name]}) for d in two.devices]})
        with run_gateway(metered) as gw:
            for model in ("small", "large", "large"):
                r = httpx.post(gw.v1 + "/chat/completions", timeout=30,
                               json={"model": model, "messages": MSG, "max_tokens": 8})
                assert r.json()["usage"]["energy_joules"] > 0
                final_energy(gw.v1, r.headers["x-joulegate-energy-id"])
    assert set(a.devices) == {"node-a"} and set(b.devices) == {"node-b"}
    assert a.devices["node-a"].ledger.totals().attributed_j > 0
    assert b.devices["node-b"].ledger.totals().attributed_j > 0


def test_agent_speaks_keepalive_http_and_refuses_what_it_does_not(
        agent: tuple[str, AgentServer]) -> None:
    import socket

    url, _ = agent
    host, port = url.removeprefix("http://").split(":")
    body = b'{"device": "cpu"}'
    open_window = (b"POST /v1/windows/open HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n"
                   % len(body) + body)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        for _ in range(2):  # two requests, one connection
            s.sendall(open_window)
            answer = s.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b'"window"' in answer
        s.sendall(b"POST /v1/windows/open HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 400 ") and b"connection: close" in answer
        assert s.recv(1) == b""  # and it closed the connection
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"GET /x HTTP/1.1\r\n" + b"X-Long: " + b"a" * 20000 + b"\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 431 ")
    assert httpx.delete(url + "/healthz").status_code == 405
    assert httpx.get(url + "/healthz").json()["devices"] == ["cpu"]


def test_batch_answers_each_call_in_order(agent: tuple[str, AgentServer]) -> None:
    url, _ = agent
    opened = httpx.post(url + "/v1/windows/batch", json={"calls": [
        {"call": "open", "device": "cpu"}, {"call": "open", "device": "nope"},
        {"call": "shut", "device": "cpu"}, "x"]}).json()["results"]
    assert [r["status"] for r in opened] == [200, 400, 400, 400]
    wid = opened[0]["body"]["window"]
    closed = httpx.post(url + "/v1/windows/batch", json={"calls": [
        {"call": "close", "device": "cpu", "window": wid, "points": [[0.01, 5, 1]]},
        {"call": "result", "device": "cpu", "window": wid, "wait_s": 5},
        {"call": "close", "device": "cpu", "window": "w0", "points": []},
        {"call": "results", "device": "cpu", "windows": [wid, "w0"]},
        {"call": "results", "device": "cpu", "windows": wid},
        {"call": "results", "device": "cpu", "windows": [wid, "w0"], "final_only": True},
    ]}).json()["results"]
    assert [r["status"] for r in closed] == [200, 200, 404, 200, 400, 200]
    assert closed[1]["body"]["final"] is False  # a batch never waits
    figures = closed[3]["body"]["figures"]
    assert figures[0]["net_j"] == closed[1]["body"]["net_j"] and figures[1] is None
    # Asked for final figures only: a window still settling is just "not final".
    assert closed[5]["body"]["figures"] == [{"final": False}, None]
    final = httpx.post(url + "/v1/windows/result", json={
        "device": "cpu", "window": wid, "wait_s": 5}).json()
    assert final["final"] is True
    assert httpx.post(url + "/v1/windows/results", json={
        "device": "cpu", "windows": [wid], "final_only": True}).json() == {"figures": [final]}
    assert httpx.post(url + "/v1/windows/batch", json={"calls": 3}).status_code == 400


def test_window_calls_travel_in_batches(agent: tuple[str, AgentServer]) -> None:
    """50 requests at once: their openings go in one exchange (one call: the
    gateway names the windows), their closes in another, and their final
    figures are asked for together; a window abandoned at once (its worker
    could not be reached) leaves nothing open."""
    url, server = agent
    ledger = server.devices["cpu"].ledger

    async def run() -> int:
        upstream = Upstream(Http1Transport(5.0, 4.0, 64))
        meter = RemoteMeter(upstream, {"cpu": url})
        try:
            windows = await asyncio.gather(*(meter.open("cpu") for _ in range(50)))
            assert len({w for w in windows if w}) == 50
            provisional = await asyncio.gather(*(
                meter.close(w, [(0.0, 20, 0), (0.01, 20, 4)]) for w in windows))
            assert all(f is not None and not f.final for f in provisional)
            finals = await asyncio.gather(*(final_figure(meter, w) for w in windows if w))
            assert all(f is not None and f.final for f in finals)
            exchanges = meter._agents["cpu"].exchanges
            await meter.abandon(await meter.open("cpu"))
            await asyncio.sleep(0.3)
            return exchanges
        finally:
            await upstream.aclose()

    before = ledger.open_windows
    exchanges = asyncio.run(run())
    assert exchanges <= 2 + 3.0 / 0.1  # opens, closes, and one poll per 100 ms at most
    assert exchanges < 20
    assert ledger.open_windows == before


def test_named_windows_open_once_and_refuse_a_taken_or_bad_name(
        agent: tuple[str, AgentServer]) -> None:
    url, server = agent
    opened = httpx.post(url + "/v1/windows/batch", json={"calls": [
        {"call": "open", "device": "cpu", "windows": ["a1", "b2"]},
        {"call": "open", "device": "cpu", "windows": ["b2", "c3"],
         "curve": [1.0, 0.01, 0.0, 0.0, 0.002, 0.0, 0.0]},
        {"call": "open", "device": "cpu", "windows": ["no spaces"]},
        {"call": "open", "device": "cpu", "windows": "a1"}]}).json()["results"]
    assert [r["status"] for r in opened] == [200, 200, 400, 400]
    assert opened[0]["body"] == {"windows": ["a1", "b2"]}
    assert opened[1]["body"] == {"windows": ["c3"]}  # b2 was taken
    closed = httpx.post(url + "/v1/windows/batch", json={"calls": [
        {"call": "close", "device": "cpu", "window": w, "points": []}
        for w in ("a1", "b2", "c3")]}).json()["results"]
    assert [r["status"] for r in closed] == [200, 200, 200]
    assert server.devices["cpu"].ledger.open_windows == 0


def test_a_large_batch_is_split(agent: tuple[str, AgentServer],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    url, server = agent
    monkeypatch.setattr("app.metering.remote.MAX_BATCH_BYTES", 1000)
    points = [(i / 100, 20, i) for i in range(40)]  # ~1 KB a close: one per batch

    async def run() -> int:
        upstream = Upstream(Http1Transport(5.0, 4.0, 64))
        meter = RemoteMeter(upstream, {"cpu": url})
        try:
            windows = await asyncio.gather(*(meter.open("cpu") for _ in range(10)))
            figures = await asyncio.gather(*(meter.close(w, points) for w in windows))
            assert all(f is not None for f in figures)
            return meter._agents["cpu"].exchanges
        finally:
            await upstream.aclose()

    assert asyncio.run(run()) >= 1 + 10  # the opens fit in one batch, each close needs one
    assert server.devices["cpu"].ledger.open_windows == 0


def test_an_agent_outage_is_logged_once_and_its_end_too(
        agent: tuple[str, AgentServer], caplog: pytest.LogCaptureFixture) -> None:
    """Under load every exchange with a dead agent fails: the log says so when
    the outage starts (and every WARN_EVERY_S while it lasts), not once per
    exchange, and says when the agent answers again; meanwhile the windows
    waiting for final figures are asked about at doubling pauses up to once
    a second (each poll for
    thousands of them stalled the requests in flight: p99 145 -> 12 ms at
    c=10 with the agent killed)."""
    url, _ = agent
    dead = f"http://127.0.0.1:{free_port()}"

    async def run() -> tuple[int, int]:
        upstream = Upstream(Http1Transport(5.0, 4.0, 64))
        meter = RemoteMeter(upstream, {"cpu": dead})
        calls = meter._agents["cpu"]
        try:
            for _ in range(20):  # one request at a time: an exchange or two each
                window = await meter.open("cpu")
                assert await meter.close(window, [(0.0, 5, 1)]) is None
                assert window is not None
                meter.when_final(window, lambda figure: None)
            # Their final figures are asked for after 0.1 s, 0.2, 0.4, ... and
            # then once a second, not every 100 ms.
            before = calls.exchanges
            await asyncio.sleep(2.0)
            assert calls.exchanges - before <= 6
            before = calls.exchanges
            await asyncio.sleep(2.0)
            assert calls.exchanges - before <= 3
            failed = calls.failed
            calls._url = url.rstrip("/") + protocol.BATCH_PATH  # the agent is back
            figure = await meter.close(await meter.open("cpu"), [(0.0, 5, 1)])
            assert figure is not None
            return failed, calls.failed
        finally:
            await upstream.aclose()

    with caplog.at_level("WARNING", logger="joulegate.meter"):
        failed, after = asyncio.run(run())
    said = [r.getMessage() for r in caplog.records if r.name == "joulegate.meter"]
    assert failed >= 20 and after == failed
    assert len(said) == 2, said
    assert "requests go on without energy figures" in said[0]
    assert f"answers again, after {failed} failed calls" in said[1]
