"""Per-request energy through the gateway with a fake 100 ms-step GPU counter.

The fake sits at the EnergyReader seam (no GPU can run in CI); everything
else is real: llama-server workers, the sampler thread, ledger and metrics.
"""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from app.factory import Seams
from telemetry.devices import DeviceSpec, MeteredDevice
from telemetry.ledger import Ledger
from tests.integration.conftest import Workers, catalog_for, final_energy, run_gateway
from tests.telemetry.fakes import SteppingCounter

pytestmark = pytest.mark.integration


def fake_gpu(spec: DeviceSpec) -> MeteredDevice:
    # read as NVML is (milliseconds a read): the sampler reads it on its beat
    counter = SteppingCounter(lambda t: 250.0, time.monotonic, step_s=0.1, read_s=0.003,
                              start_t=time.monotonic())
    return MeteredDevice(spec, counter, Ledger("nvml", idle_power_w=100.0))


def test_every_request_gets_energy_and_totals_add_up(workers: Workers) -> None:
    seams = Seams(device_factory=fake_gpu)
    with run_gateway(catalog_for([workers.small], [workers.large]), seams) as gw:
        client = openai.OpenAI(base_url=gw.v1, api_key="x", max_retries=0)
        figures = []
        for model in ("small", "large", "auto"):
            r = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "count to ten"}],
                max_tokens=24)
            usage = r.usage.model_dump()  # type: ignore[union-attr]
            assert usage["energy_source"] == "nvml"
            assert usage["energy_joules"] >= 0
            # what it would have cost alone, from the backend's curve, labelled
            assert usage["energy_standalone_joules"] > 0
            assert usage["energy_standalone_source"] == "estimate"
            figures.append(usage)
        stream = client.chat.completions.create(
            model="large", messages=[{"role": "user", "content": "hi"}], max_tokens=24,
            stream=True, stream_options={"include_usage": True})
        last = list(stream)[-1]
        assert last.usage is not None
        assert last.usage.model_dump()["energy_source"] == "nvml"
        time.sleep(0.6)
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'joulegate_request_energy_joules_count{backend="large-llamacpp",source="nvml"' \
            in metrics
        assert 'joulegate_energy_joules_total{backend="large-llamacpp",phase="decode"' in metrics
        assert "joulegate_device_power_watts" in metrics
        ledger = seams.devices[0].ledger
        t = ledger.totals()
        assert t.measured_j > 0
        assert t.attributed_j + t.idle_j + t.unattributed_j == pytest.approx(t.measured_j)


def test_the_first_request_after_start_gets_energy(workers: Workers) -> None:
    """The gateway serves once its counter has been read: a request answered
    before the first reading would overlap no span and keep 0 J for good."""
    def waking_gpu(spec: DeviceSpec) -> MeteredDevice:
        # its first read takes 4 s (a driver waking up)
        counter = SteppingCounter(lambda t: 250.0, time.monotonic, step_s=0.1, read_s=0.003,
                                  first_read_s=4.0, start_t=time.monotonic())
        return MeteredDevice(spec, counter, Ledger("nvml", idle_power_w=100.0))

    seams = Seams(device_factory=waking_gpu)
    with run_gateway(catalog_for([workers.small], [workers.large]), seams) as gw:
        assert seams.devices[0].ledger.last_counter_j is not None
        r = httpx.post(gw.v1 + "/chat/completions", json={
            "model": "small", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
        assert r.status_code == 200
        fig = final_energy(gw.v1, r.headers["x-joulegate-energy-id"])
        assert fig["final"] is True
        assert fig["net_j"] > 0
