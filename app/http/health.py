"""What the gateway serves and whether it can: models, liveness, readiness, metrics."""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from app.http.auth import authorize
from app.http.gateway import gateway_of
from telemetry.metrics import CONTENT_TYPE

COUNTER_STALE_S = 5.0  # a counter read on a 100 ms beat or faster: 50 reads missed


async def models(request: Request) -> Response:
    gw = gateway_of(request)
    await authorize(gw, request, generates=False)
    catalog, pool = gw.planner.catalog, gw.planner.pool
    now = int(time.time())

    def entry(name: str, about: dict[str, Any]) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": now, "owned_by": "joulegate",
                "joulegate": about}

    data = [entry("auto", {"kind": "router"})]
    data += [entry(t, {"kind": "tier", "up": pool.tier_up(t)}) for t in catalog.tiers]
    data += [entry(b.name, {"kind": "backend", "engine": b.kind, "tier": b.tier,
                            "upstream_model": b.model, "replicas": len(b.replicas),
                            "up": pool.backend_up(b.name)}) for b in catalog.backends]
    return JSONResponse({"object": "list", "data": data})


async def healthz() -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready while some tier can serve; `degraded` names the tiers that cannot.
    `energy`: each device this process meters, `ok` or `stale` (its counter
    not read for COUNTER_STALE_S: requests are still answered, their figures
    wait for its next reading and stay provisional meanwhile)."""
    gw = gateway_of(request)
    planner = gw.planner
    tiers = {t: planner.pool.tier_up(t) for t in planner.catalog.tiers}
    degraded = [t for t, up in tiers.items() if not up]
    ok = len(degraded) < len(tiers)
    database = "ok" if gw.keys is None or gw.keys.database_ok else "unreachable"
    energy = {d.device: counter_state(d.totals().read_age_s) for d in gw.devices()}
    state = "ready" if ok and not degraded and database == "ok" and \
        all(e == "ok" for e in energy.values()) else "degraded" if ok else "unavailable"
    # Serving from memory while the database is away: still ready (keys and
    # budgets are in memory, usage rows wait), but says so; a stale counter too.
    return JSONResponse({"ready": ok, "state": state, "tiers": tiers, "degraded": degraded,
                         "database": database, "energy": energy},
                        status_code=200 if ok else 503)


def counter_state(read_age_s: float | None) -> str:
    return "ok" if read_age_s is not None and read_age_s <= COUNTER_STALE_S else "stale"


async def metrics(request: Request) -> Response:
    return Response(gateway_of(request).metrics.render(), media_type=CONTENT_TYPE)
