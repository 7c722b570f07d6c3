"""Metric updates added up and written together give exactly what
prometheus_client's own inc and observe give, one by one."""

from __future__ import annotations

import asyncio
import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from telemetry.ledger import Totals
from telemetry.metrics import DeviceView, Metrics, _Batch, _Children
from telemetry.timeline import EnergyFigure

# Exact in binary (sums do not depend on their order); 1.0 and 10.0 on bounds.
VALUES = [0.0, 2.0**-14, 2.0**-10, 0.0625, 1.0, 0.75, 10.0, 4.0, 2.0**30, math.inf, 0.5,
          math.nan]  # NaN: in no bucket, and the sum of its label NaN


def _pair() -> tuple[CollectorRegistry, Counter, Histogram]:
    r = CollectorRegistry()
    return r, Counter("c", "c", ["k"], registry=r), Histogram(
        "h", "h", ["k"], buckets=(0.0001, 0.001, 0.1, 1, 10), registry=r)


def _without_created(text: bytes) -> list[str]:
    return [line for line in text.decode().splitlines() if "_created" not in line]


def test_a_batch_writes_what_inc_and_observe_would() -> None:
    direct, dc, dh = _pair()
    batched, bc, bh = _pair()
    batch, counter, histogram = _Batch(), _Children(bc), _Children(bh)
    for i, v in enumerate(VALUES):
        key = "a" if i % 2 else "b"
        dc.labels(key).inc(i)
        dh.labels(key).observe(v)
        batch.inc(counter, (key,), i)
        batch.observe(histogram, (key,), v)
        if i == 4:
            batch.flush()  # a flush midway changes nothing
    batch.flush()
    assert _without_created(generate_latest(batched)) == _without_created(
        generate_latest(direct))


def test_a_negative_increment_is_refused_at_once() -> None:
    _, counter, _ = _pair()
    with pytest.raises(ValueError):
        _Batch().inc(_Children(counter), ("a",), -1)


def test_a_scrape_sees_every_update_and_the_flusher_writes_them_meanwhile() -> None:
    registry = CollectorRegistry()
    m = Metrics(registry)
    m.request("small", "small-1b", "forced", "forced", "ok")
    m.request_energy("small", "small-1b", EnergyFigure(
        net_j=2.5, gross_j=3.0, source="estimate", final=True, prefill_j=1.0, decode_j=1.5,
        standalone_j=2.5))
    assert registry.get_sample_value("joulegate_requests_total", {
        "tier": "small", "backend": "small-1b", "route": "forced", "category": "forced",
        "status": "ok"}) is None  # not written yet
    assert b'status="ok",tier="small"} 1.0' in m.render()
    m.tokens("small", "small-1b", 10, 4)

    async def flushed() -> float | None:
        task = asyncio.create_task(m.flushing(0.01))
        await asyncio.sleep(0.05)
        task.cancel()
        return registry.get_sample_value("joulegate_tokens_total", {
            "tier": "small", "backend": "small-1b", "kind": "prompt"})

    assert asyncio.run(flushed()) == 10
    assert registry.get_sample_value("joulegate_request_energy_joules_sum", {
        "tier": "small", "backend": "small-1b", "source": "estimate"}) == 2.5


def test_each_devices_totals_are_exported_with_the_requests_given_up() -> None:
    totals = Totals(measured_j=10.0, attributed_j=6.0, idle_j=3.0, unattributed_j=1.0,
                    idle_power_w=70.0, power_w=90.0, resets=0, open_windows=2,
                    read_age_s=31.0, given_up=7)
    metrics = Metrics()
    metrics.watch_devices(lambda: [DeviceView("gpu0", "h", "nvml", lambda: totals)])
    samples = {s.name: s.value for f in text_string_to_metric_families(metrics.render().decode())
               for s in f.samples if s.labels.get("device") == "gpu0"}
    assert samples["joulegate_windows_given_up_total"] == 7
    assert samples["joulegate_counter_read_age_seconds"] == 31.0
    assert samples["joulegate_tail_energy_joules_total"] == 1.0
    assert samples["joulegate_device_energy_joules_total"] == 10.0
