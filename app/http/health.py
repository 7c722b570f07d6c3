"""What the gateway serves and whether it can: models, liveness, readiness, metrics."""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from app.http.auth import authorize
from app.http.gateway import gateway_of
from telemetry.metrics import CONTENT_TYPE


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
    """Ready while some tier can serve; `degraded` names the tiers that cannot."""
    gw = gateway_of(request)
    planner = gw.planner
    tiers = {t: planner.pool.tier_up(t) for t in planner.catalog.tiers}
    degraded = [t for t, up in tiers.items() if not up]
    ok = len(degraded) < len(tiers)
    database = "ok" if gw.keys is None or gw.keys.database_ok else "unreachable"
    state = "ready" if ok and not degraded and database == "ok" else \
        "degraded" if ok else "unavailable"
    # Serving from memory while the database is away: still ready (keys and
    # budgets are in memory, usage rows wait), but says so.
    return JSONResponse({"ready": ok, "state": state, "tiers": tiers, "degraded": degraded,
                         "database": database}, status_code=200 if ok else 503)


async def metrics(request: Request) -> Response:
    return Response(gateway_of(request).metrics.render(), media_type=CONTENT_TYPE)
