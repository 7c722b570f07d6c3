"""Prometheus metrics: the only module that imports prometheus_client.

Names carry their unit; labels never carry request ids. Device counters are
read from the ledgers at scrape time by a collector, so they are exact.

Counter and histogram updates are added up in plain dicts and written to
prometheus_client's values together (`flush`): at every scrape of this
process, and every FLUSH_EVERY_S while serving (`flushing`), so that with
several gateway processes a scrape answered by one sees the others' requests
within that time. prometheus_client's own `inc` and `observe` cost 1-2 us each
in one process and 3-6 us under its multiprocess mode, which writes every
update to a memory-mapped file; a request makes eight
(`python -m bench.metric_updates`).
"""

from __future__ import annotations

import asyncio
import bisect
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from telemetry.ledger import Totals
from telemetry.timeline import EnergyFigure

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_ENERGY_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
FLUSH_EVERY_S = 0.1
# A busy core's watts where the host's are not configured (the agent; a
# gateway reads JOULEGATE_CPU_WATTS_PER_CORE): a server package's TDP over
# its cores, e.g. 205 W / 20 cores. Labelled `estimate`.
OWN_WATTS_PER_CORE = 10.0


@dataclass(frozen=True)
class DeviceView:
    """What the collector needs of one metered device."""

    device: str
    host: str
    source: str
    totals: Callable[[], Totals]


class _DeviceCollector(Collector):
    def __init__(self, devices: Callable[[], Iterable[DeviceView]]) -> None:
        self._devices = devices

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        energy = CounterMetricFamily(
            "joulegate_device_energy_joules", "Energy measured on the device",
            labels=["device", "host", "source"])
        idle = CounterMetricFamily(
            "joulegate_idle_energy_joules", "Energy booked to the idle baseline",
            labels=["device", "host", "source"])
        tail = CounterMetricFamily(
            "joulegate_tail_energy_joules",
            "Energy above idle while no request was running (tail, unattributed)",
            labels=["device", "host", "source"])
        attributed = CounterMetricFamily(
            "joulegate_attributed_energy_joules", "Energy above idle attributed to requests",
            labels=["device", "host", "source"])
        power = GaugeMetricFamily(
            "joulegate_device_power_watts", "Instant power of the device",
            labels=["device", "host", "source"])
        idle_power = GaugeMetricFamily(
            "joulegate_device_idle_power_watts", "Idle baseline power of the device",
            labels=["device", "host", "source"])
        read_age = GaugeMetricFamily(
            "joulegate_counter_read_age_seconds",
            "Seconds since the device's energy counter was last read (a failing counter's grow)",
            labels=["device", "host", "source"])
        given_up = CounterMetricFamily(
            "joulegate_windows_given_up",
            "Requests whose energy figure stays provisional: the counter was not read for "
            "30 s while they ran or waited for it",
            labels=["device", "host", "source"])
        for d in self._devices():
            t = d.totals()
            labels = [d.device, d.host, d.source]
            given_up.add_metric(labels, t.given_up)
            if t.read_age_s is not None:
                read_age.add_metric(labels, t.read_age_s)
            energy.add_metric(labels, t.measured_j)
            idle.add_metric(labels, t.idle_j)
            tail.add_metric(labels, t.unattributed_j)
            attributed.add_metric(labels, t.attributed_j)
            if t.power_w is not None:
                power.add_metric(labels, t.power_w)
            if t.idle_power_w is not None:
                idle_power.add_metric(labels, t.idle_power_w)
        yield from (energy, idle, tail, attributed, power, idle_power, read_age, given_up)


class _Children:
    """A labelled metric's children by label values, looked up once each
    (prometheus_client's `labels()` validates and locks on every call)."""

    def __init__(self, metric: Any) -> None:
        self._metric = metric
        self._children: dict[tuple[str, ...], Any] = {}
        # A histogram's bucket bounds (+Inf last); a metric without labels is its own child.
        self.bounds: list[float] = list(getattr(metric, "_upper_bounds", None) or [])

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = (
                self._metric.labels(*values) if values else self._metric)
        return child


class _Batch:
    """Counter increments and histogram observations not yet written to their
    prometheus_client children, added up per metric and label values (the
    children are looked up when written)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # updates come from the event loop; scrapes too
        self._counts: dict[tuple[_Children, tuple[str, ...]], float] = {}
        # per histogram and label values: [sum], the count per bucket
        self._observed: dict[tuple[_Children, tuple[str, ...]],
                             tuple[list[float], list[int]]] = {}

    def inc(self, metric: _Children, labels: tuple[str, ...], amount: float) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        key = (metric, labels)
        with self._lock:
            self._counts[key] = self._counts.get(key, 0.0) + amount

    def observe(self, metric: _Children, labels: tuple[str, ...], value: float) -> None:
        bounds = metric.bounds
        # The first bound >= value; NaN, equal to nothing, falls in no bucket,
        # as in observe() (bisect would put it in the first).
        bucket = bisect.bisect_left(bounds, value) if value == value else len(bounds)
        key = (metric, labels)
        with self._lock:
            entry = self._observed.get(key)
            if entry is None:
                entry = self._observed[key] = ([0.0], [0] * len(bounds))
            entry[0][0] += value
            if bucket < len(bounds):
                entry[1][bucket] += 1

    def flush(self) -> None:
        """Write what is pending (as `inc` and `observe` would have, one by one)."""
        with self._lock:
            counts, self._counts = self._counts, {}
            observed, self._observed = self._observed, {}
        for (metric, labels), amount in counts.items():
            metric(*labels).inc(amount)
        for (metric, labels), (total, buckets) in observed.items():
            child = metric(*labels)
            child._sum.inc(total[0])
            for value, n in zip(child._buckets, buckets, strict=True):
                if n:
                    value.inc(n)


class Metrics:
    """All gateway metrics, registered on an injected registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else CollectorRegistry()
        self.registry = registry
        self._batch = _Batch()
        r = registry
        self._requests = _Children(Counter(
            "joulegate_requests", "Requests by outcome",
            ["tier", "backend", "route", "category", "status"], registry=r))
        self._request_energy = _Children(Histogram(
            "joulegate_request_energy_joules", "Net energy per request (final figures)",
            ["tier", "backend", "source"], buckets=_ENERGY_BUCKETS, registry=r))
        self._energy = _Children(Counter(
            "joulegate_energy_joules", "Net energy attributed to requests, by phase",
            ["tier", "backend", "phase", "source"], registry=r))
        self._tokens = _Children(Counter(
            "joulegate_tokens", "Tokens processed", ["tier", "backend", "kind"], registry=r))
        self._decisions = _Children(Counter(
            "joulegate_routing_decisions", "Routing decisions",
            ["tier", "strategy", "category"], registry=r))
        self._saved = _Children(Counter(
            "joulegate_energy_saved_joules", "Expected energy saved against a baseline",
            ["baseline"], registry=r))
        self._route_s = _Children(Histogram(
            "joulegate_route_seconds", "Time to decide a route", buckets=_FAST_BUCKETS,
            registry=r))
        self._upstream_s = _Children(Histogram(
            "joulegate_upstream_seconds", "Time spent waiting for workers",
            ["tier", "backend"], buckets=_SECONDS_BUCKETS, registry=r))
        self._overhead_s = _Children(Histogram(
            "joulegate_overhead_seconds", "Time the gateway added to a request",
            buckets=_FAST_BUCKETS, registry=r))
        self._key_energy = _Children(Counter(
            "joulegate_key_energy_joules", "Net joules of finished requests, by API key name",
            ["key"], registry=r))
        self._backend_up = _Children(Gauge(
            "joulegate_backend_up", "1 when a backend has a healthy replica", ["backend"],
            registry=r, multiprocess_mode="max"))
        self._shared_up: Gauge | None = None
        self._shared_local: _Children | None = None
        self._own_cpu = _Children(Counter(
            "joulegate_own_cpu_seconds",
            "CPU time of joulegate's own process (a gateway, or the agent)",
            registry=r))
        self._own_energy = _Children(Counter(
            "joulegate_own_energy_joules",
            "Joulegate's own energy: its CPU seconds x the host's watts per busy core",
            ["source"], registry=r))
        self._cpu_seen_s = time.process_time()
        self._stops = _Children(Counter(
            "joulegate_generation_stops", "Generations the gateway stopped, by reason",
            ["tier", "backend", "reason"], registry=r))
        self._thinking = _Children(Counter(
            "joulegate_thinking_budget_requests",
            "Requests sent to a reasoning backend with a capped thinking span",
            ["tier", "backend"], registry=r))
        self._rejected = _Children(Counter(
            "joulegate_rejected_requests", "Requests answered with an error by the gateway",
            ["status", "code"], registry=r))

    def init_backend(self, tier: str, backend: str, baseline: str) -> None:
        """Create the zero series up front, so dashboards show 0, not 'no data'."""
        self._stops(tier, backend, "loop")
        self._thinking(tier, backend)
        self._saved(baseline)
        self._backend_up(backend)

    def shared_state_up(self, up: bool) -> None:
        """Whether the shared limits' store (Redis) answers: only exported
        where one is configured."""
        if self._shared_up is None:
            self._local_decisions()  # its zero series, from the start
            self._shared_up = Gauge(
                "joulegate_shared_state_up",
                "1 when the limits shared by every gateway (Redis) answer, 0 while this "
                "gateway enforces its own", registry=self.registry, multiprocess_mode="min")
        self._shared_up.set(1 if up else 0)

    def decided_locally(self, operation: str) -> None:
        """A request's rates (`admit`) or joule hold (`reserve`) decided by
        this gateway's own windows because the shared limits did not answer
        in time (or were down): what the shared limits did not see."""
        self._batch.inc(self._local_decisions(), (operation,), 1)

    def _local_decisions(self) -> _Children:
        if self._shared_local is None:
            self._shared_local = _Children(Counter(
                "joulegate_shared_state_local_decisions",
                "Requests whose rates or joule hold this gateway decided alone: the shared "
                "limits (Redis) did not answer in time", ["operation"], registry=self.registry))
            for operation in ("admit", "reserve"):
                self._shared_local(operation)
        return self._shared_local

    def thinking(self, tier: str, backend: str) -> None:
        self._batch.inc(self._thinking, (tier, backend), 1)

    def rejected(self, status: int, code: str | None) -> None:
        self._batch.inc(self._rejected, (str(status), code or "none"), 1)

    def watch_devices(self, devices: Callable[[], Iterable[DeviceView]]) -> None:
        self.registry.register(_DeviceCollector(devices))

    def request(self, tier: str, backend: str, route: str, category: str, status: str) -> None:
        self._batch.inc(self._requests, (tier, backend, route, category, status), 1)

    def key_energy(self, key_name: str, joules: float) -> None:
        """Net joules per API key, by its name (names are the admin's: bounded;
        never the key itself)."""
        self._batch.inc(self._key_energy, (key_name,), max(0.0, joules))

    def request_energy(self, tier: str, backend: str, figure: EnergyFigure) -> None:
        self._batch.observe(self._request_energy, (tier, backend, figure.source), figure.net_j)
        self._batch.inc(self._energy, (tier, backend, "prefill", figure.source), figure.prefill_j)
        self._batch.inc(self._energy, (tier, backend, "decode", figure.source), figure.decode_j)

    def tokens(self, tier: str, backend: str, prompt: int, completion: int) -> None:
        self._batch.inc(self._tokens, (tier, backend, "prompt"), prompt)
        self._batch.inc(self._tokens, (tier, backend, "completion"), completion)

    def decision(self, tier: str, strategy: str, category: str, seconds: float) -> None:
        self._batch.inc(self._decisions, (tier, strategy, category), 1)
        self._batch.observe(self._route_s, (), seconds)

    def saved(self, baseline: str, joules: float) -> None:
        if joules > 0:
            self._batch.inc(self._saved, (baseline,), joules)

    def observe_upstream(self, tier: str, backend: str, seconds: float) -> None:
        self._batch.observe(self._upstream_s, (tier, backend), seconds)

    def observe_overhead(self, seconds: float) -> None:
        self._batch.observe(self._overhead_s, (), seconds)

    def backend_up(self, backend: str, up: bool) -> None:
        self._backend_up(backend).set(1 if up else 0)

    def stop(self, tier: str, backend: str, reason: str) -> None:
        self._batch.inc(self._stops, (tier, backend, reason), 1)

    def flush(self) -> None:
        """Write the updates made since the last flush to the metrics' values."""
        self._batch.flush()

    def own_cost(self, watts_per_core: float, source: str) -> None:
        """Book this process's CPU time since the last call, and its joules at
        `watts_per_core` per busy core (`source`: where that figure comes from)."""
        now = time.process_time()  # every thread of this process
        spent, self._cpu_seen_s = max(0.0, now - self._cpu_seen_s), now
        self._batch.inc(self._own_cpu, (), spent)
        self._batch.inc(self._own_energy, (source,), spent * watts_per_core)

    async def flushing(self, every_s: float = FLUSH_EVERY_S,
                       own: Callable[[], tuple[float, str]] | None = None) -> None:
        """Flush every `every_s` until cancelled (then once more); with `own`
        (the host's watts per busy core and their source, telemetry.corewatts),
        book this process's CPU and joules."""
        try:
            while True:
                await asyncio.sleep(every_s)
                if own is not None:
                    self.own_cost(*own())
                self.flush()
        finally:
            if own is not None:
                self.own_cost(*own())
            self.flush()

    def render(self) -> bytes:
        """The exposition; with several gateway processes (`serve --workers`,
        PROMETHEUS_MULTIPROC_DIR set) every process's values, merged (each
        process's updates of the last FLUSH_EVERY_S may not be in yet)."""
        self.flush()
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not directory:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged, directory)  # type: ignore[no-untyped-call]
        return generate_latest(merged)
