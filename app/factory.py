"""The composition root: builds every part from settings and injected seams."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.artifacts import curve_warnings, load_curve
from app.catalog import Catalog, Device, load_catalog
from app.forward.exchange import Parts
from app.forward.planner import Planner, RouterLike
from app.forward.proxy import Proxy
from app.forward.traffic import Traffic
from app.http.asgi import GatewayApp
from app.http.docs import install_docs
from app.http.gateway import Gateway
from app.http.guard import Guard, allowed_hosts
from app.http.handlers import install_handlers
from app.http.openapi import install_openapi
from app.http.requests import ChatRequest, CompletionRequest
from app.http.routes import build_routes
from app.metering.local import LocalMeter
from app.metering.meter import Meter
from app.metering.remote import RemoteMeter
from app.routing import LengthBook, build_router, catalog_curves, few_shot
from app.settings import Settings
from app.tenancy.admission import Admission
from app.tenancy.keys import KeyRing, KeyStore, kept_secret
from app.tenancy.shared import SharedState
from app.tenancy.spend import SpendLedger, UsageRow
from app.upstream.client import (
    MAX_CONNECTIONS,
    HttpxTransport,
    Timeouts,
    Transport,
    Upstream,
    httpx_transport,
)
from app.upstream.contexts import learned_contexts
from app.upstream.http1 import Http1Transport
from app.upstream.pool import HealthChecker, ReplicaPool
from router.placeholder import PlaceholderRouter
from telemetry.corewatts import CoreWatts, host_packages
from telemetry.devices import (
    DeviceSpec,
    MeteredDevice,
    metered_device,
    start_samplers,
    wait_for_readings,
)
from telemetry.metrics import DeviceView, Metrics
from telemetry.rates import TokenRates
from telemetry.sampler import Sampler

if TYPE_CHECKING:
    import httpx
    from prometheus_client import CollectorRegistry

log = logging.getLogger("joulegate")
GC_THRESHOLDS = (50_000, 20, 100)  # the collector's generations (Python's: 700, 10, 10)

def device_spec(d: Device) -> DeviceSpec:
    return DeviceSpec(d.name, d.host, d.source, d.index, d.idle_power_w,
                      d.max_power_w, d.estimate_idle_power_w)


@dataclass
class Seams:
    """What tests (and only tests) replace: no GPU can run in CI."""

    registry: CollectorRegistry | None = None
    client: httpx.AsyncClient | None = None
    device_factory: Callable[[DeviceSpec], MeteredDevice] | None = None
    router: RouterLike | None = None
    devices: list[MeteredDevice] = field(default_factory=list)


def make_router(catalog: Catalog, book: LengthBook) -> RouterLike:
    """The learned router; the placeholder rule only where models.yaml has no
    quality table (it cannot weigh quality against energy without one)."""
    if catalog.quality:
        return build_router(catalog, book)
    log.warning("models.yaml has no quality table: using the placeholder routing rule")
    first = {t: catalog.backends_of(t)[0].name for t in catalog.tiers}
    return PlaceholderRouter(catalog.tiers, first, catalog.defaults.max_tokens)


def _transport(settings: Settings) -> Transport:
    """One pooled transport for all workers and agents. The keep-alive stays
    below llama-server's 5 s so that the gateway, not the worker, usually
    closes an idle connection."""
    if settings.upstream_transport == "httpx":
        return httpx_transport(settings.connect_timeout_seconds,
                               settings.upstream_keepalive_seconds)
    return Http1Transport(settings.connect_timeout_seconds,
                          settings.upstream_keepalive_seconds, MAX_CONNECTIONS)


def _meter(catalog: Catalog, settings: Settings, seams: Seams, upstream: Upstream,
           metrics: Metrics) -> tuple[Meter, list[Sampler], Callable[[], list[DeviceView]]]:
    """A remote agent's meter where devices name one; else ledgers in this
    process, fed by samplers started here. And the devices' totals, where
    this process meters them (an agent's are on its /metrics)."""
    agents = {d.name: str(d.agent or settings.agent_url) for d in catalog.devices
              if d.agent or settings.agent_url}
    if agents:
        for d in catalog.devices:
            if d.name not in agents:
                log.warning("device %s has no agent (the other devices do): its "
                            "requests get no energy figure", d.name)
        for device, url in sorted(agents.items()):
            log.info("energy of %s: metered by the agent at %s", device, url)
        return RemoteMeter(upstream, agents, token=settings.agent_secret()), [], list
    weights = {d.name: d.prefill_weight for d in catalog.devices}
    factory = seams.device_factory or (lambda s: metered_device(s, weights[s.name]))
    devices = [factory(device_spec(d)) for d in catalog.devices]
    seams.devices[:] = devices
    for md in devices:
        log.info("energy of %s: %s (%s)", md.spec.name, md.reader.source, md.reader.name)
    samplers = start_samplers(devices, settings.sample_hz, settings.sample_hz_quiet,
                              defer_settling=True)  # settled as requests end (LocalMeter)

    def views() -> list[DeviceView]:
        return [d.view() for d in devices]

    metrics.watch_devices(views)
    return LocalMeter({d.spec.name: d.ledger for d in devices}), samplers, views


def _keys(settings: Settings) -> KeyRing:
    store = KeyStore(settings.database())
    admin = settings.admin_key or kept_secret(settings.state_dir / "admin-key", create=False)
    keys = KeyRing(store, admin_secret=admin)
    if not keys.active():
        log.warning("no API keys in %s: serving without authentication "
                    "(create one: joulegate keys create --name NAME)", settings.state_dir)
    return keys


@contextlib.contextmanager
def _long_lived() -> Iterator[None]:
    """What start-up built lives as long as the process (the router's
    vocabularies and coefficients are most of it): out of the cyclic
    collector's sight, a full collection no longer walks it. It took ~95 ms,
    a stall every request in flight then waited out. And the young generation
    is collected every 50,000 allocations, not 700: a request allocates
    hundreds of short-lived objects, which reference counting frees; only
    cycles wait longer."""
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def create_app(settings: Settings, catalog: Catalog | None = None,
               seams: Seams | None = None) -> GatewayApp:
    seams = seams or Seams()
    configured: Catalog = catalog or load_catalog(settings.models_file)

    @contextlib.asynccontextmanager
    async def lifespan(app: GatewayApp) -> AsyncIterator[None]:
        metrics = Metrics(seams.registry)
        transport = HttpxTransport(seams.client) if seams.client else _transport(settings)
        upstream = Upstream(transport, Timeouts(
            settings.connect_timeout_seconds, settings.first_byte_timeout_seconds,
            settings.between_chunks_timeout_seconds))
        catalog, said = await learned_contexts(configured, upstream)
        for line in curve_warnings(catalog, {n: (w.weights, w.build) for n, w in said.items()}):
            log.warning("%s", line)
        log.info("backends: %s", "; ".join(
            f"{b.name} ({b.kind}, tier {b.tier}, model {b.model}, {len(b.replicas)} "
            f"replica{'s' if len(b.replicas) != 1 else ''})" for b in catalog.backends))
        curves = catalog_curves(catalog)
        pool = ReplicaPool(catalog, settings.queue_timeout_seconds, curves=curves)
        meter, samplers, device_views = _meter(catalog, settings, seams, upstream, metrics)
        lengths_file = catalog.routing.lengths_file
        book = LengthBook(catalog.path(lengths_file) if lengths_file else None)
        router = seams.router or make_router(catalog, book)
        keys = _keys(settings)
        shared = None if not settings.redis_url else SharedState(
            settings.redis_url, settings.redis_timeout_ms / 1000, metrics.shared_state_up)
        admission = Admission(shared=shared, on_local=metrics.decided_locally)
        if shared is not None:
            await shared.start()
        spend = SpendLedger(settings.database(), journal=settings.state_dir / "journal")
        spend.prime(k for k in keys.active_keys() if k.joule_budget is not None)
        keys.start()
        planner = Planner(catalog, pool, router, metrics, Traffic(), spend,
                          settings.budget_steer_at, few_shot(catalog).messages)
        proxy = Proxy(Parts(pool, upstream, meter, metrics, book.observe,
                            token_rates(catalog), admission.tokens,
                            lambda row: record_usage(row, spend, metrics),
                            on_answered=spend.answered, on_settled=admission.settle), planner)
        checker = HealthChecker(pool, upstream, settings.health_interval_seconds,
                                metrics.backend_up)
        # serve once each counter has been read: a request answered before its
        # device's first reading would keep 0 J
        await asyncio.to_thread(wait_for_readings, samplers)
        await checker.check_once()
        checker.start()
        for b in catalog.backends:
            metrics.init_backend(b.tier, b.name, catalog.baseline)
        app.state.on_error = metrics.rejected
        app.state.gateway = Gateway(planner, proxy, metrics, settings.max_body_bytes,
                                    settings.policy, settings.body_timeout_seconds, keys=keys,
                                    admission=admission, spend=spend,
                                    curves=curves, devices=device_views)
        core_watts = CoreWatts(settings.cpu_watts_per_core, host_packages())
        flusher = asyncio.create_task(metrics.flushing(own=core_watts.rate))
        try:
            with _long_lived():
                yield
        finally:
            await checker.stop()
            await proxy.drain()
            flusher.cancel()  # flushes once more
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
            book.save()
            for s in samplers:
                s.stop()
            await upstream.aclose()
            spend.close()  # writes the rows still queued
            keys.close()
            if shared is not None:
                await shared.close()

    app = _http_app(lifespan, configured)
    app.guard = Guard(allowed_hosts(settings.allowed_hosts, settings.host))
    return app


def _http_app(lifespan: Callable[[GatewayApp], contextlib.AbstractAsyncContextManager[None]],
              catalog: Catalog) -> GatewayApp:
    """The ASGI app: routes, error handlers, offline docs, the OpenAPI schema."""
    app = GatewayApp(title="joulegate", lifespan=lifespan, docs_url=None, redoc_url=None)
    install_handlers(app)
    install_docs(app)
    routes = build_routes()
    app.include_router(routes)
    app.route_directly(routes)
    names = ["auto", *catalog.tiers, *(b.name for b in catalog.backends)]
    install_openapi(app, [ChatRequest, CompletionRequest], names,
                    max(b.context_limit for b in catalog.backends))
    return app


def record_usage(row: UsageRow, spend: SpendLedger, metrics: Metrics) -> None:
    spend.record(row)
    if row.key_name is not None and row.energy_net_j is not None:
        metrics.key_energy(row.key_name, row.energy_net_j)


def app_from_env() -> GatewayApp:
    """One of several gateway processes (`joulegate serve --workers N`): its
    settings, models file and agent URL come from the environment."""
    return create_app(Settings())


def token_rates(catalog: Catalog) -> dict[str, TokenRates]:
    """Each backend's marginal token costs (its curve's), for energy attribution."""
    return {b.name: TokenRates.from_curve(load_curve(catalog.path(b.curves)).coef)
            for b in catalog.backends if b.curves}
