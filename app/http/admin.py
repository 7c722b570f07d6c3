"""A key's own records (energy figures, usage) and the admin's key management."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from app.errors import (
    admin_only,
    bad_request,
    energy_not_found,
    key_exists,
    key_not_found,
)
from app.http.auth import admin_store, authorize
from app.http.body import json_body
from app.http.gateway import gateway_of
from app.http.requests import validate_new_key
from app.tenancy.keys import ADMIN_ID
from app.tenancy.report import build_report, device_tails
from app.tenancy.spend import SpendLedger, parse_since

USAGE_ROWS = 1000  # GET /v1/usage lists the newest this many requests
NEW_KEY_BODY_BYTES = 64 * 1024


async def energy(request: Request, device: str, wid: str) -> Response:
    gw = gateway_of(request)
    key = await authorize(gw, request, generates=False)
    name = f"{device}/{wid}"
    owner = gw.proxy.parts.owners.get(name)
    if key is not None and key.id != ADMIN_ID and owner != key.id:  # as if unknown
        raise energy_not_found(name)
    figure = await gw.proxy.energy(name)
    if figure is None:
        raise energy_not_found(name)
    return JSONResponse({"id": name, **asdict(figure)})


async def usage(request: Request, since: str = "7d") -> Response:
    """Finished requests since `since` (e.g. 24h, 7d): a key sees its own
    (an open gateway: all), with totals by day and by model."""
    gw = gateway_of(request)
    key = await authorize(gw, request, generates=False)
    start = _window_start(since)
    mine = key.id if key is not None and key.id != ADMIN_ID else None
    if gw.spend is None:
        found: dict[str, Any] = {"totals": {}, "by_day": {}, "by_model": {}, "data": []}
    else:  # off the event loop: a database round trip or two
        found = await anyio.to_thread.run_sync(_usage, gw.spend, mine, start)
    out: dict[str, Any] = {"object": "list", "since": since, **found}
    if key is not None:  # who asked: the console's scope and the budget left
        out["key"] = {"name": key.name, "admin": key.id == ADMIN_ID,
                      "joule_budget": key.joule_budget, "budget_period": key.budget_period,
                      "spent_j": None if gw.spend is None or key.joule_budget is None
                      else gw.spend.spent_j(key)}
    return JSONResponse(out)


async def report(request: Request, since: str = "24h", reference: str | None = None
                 ) -> Response:
    """The energy report (app/tenancy/report.py) over `since`: every key's
    requests, so the admin key's (or an open gateway's)."""
    gw = gateway_of(request)
    key = await authorize(gw, request, generates=False)
    if key is not None and key.id != ADMIN_ID:
        raise admin_only()
    start = _window_start(since)
    groups = [] if gw.spend is None else await anyio.to_thread.run_sync(
        gw.spend.report_groups, start)
    return JSONResponse({"object": "report", "since": since,
                         **build_report(groups, gw.curves, reference),
                         "devices": device_tails(gw.devices())})


def _window_start(since: str) -> float:
    """The start (a time.time()) of a `since` window such as 24h or 7d; 400 otherwise."""
    seconds = parse_since(since)
    if seconds is None:
        raise bad_request("since: a number and a unit, e.g. 24h or 7d", "since",
                          "invalid_since")
    return time.time() - seconds


def _usage(spend: SpendLedger, key_id: str | None, since: float) -> dict[str, Any]:
    return {**spend.totals(key_id, since), "data": spend.rows(key_id, since, USAGE_ROWS)}


async def list_keys(request: Request) -> Response:
    store = await admin_store(request)
    keys = await anyio.to_thread.run_sync(store.all)  # the database, off the event loop
    return JSONResponse({"object": "list", "data": [k.public() for k in keys]})


async def create_key(request: Request) -> Response:
    store = await admin_store(request)
    spec = validate_new_key(await json_body(request, NEW_KEY_BODY_BYTES))
    try:
        key, secret = await anyio.to_thread.run_sync(
            store.create, spec.name, spec.rpm, spec.tpm, spec.joule_budget,
            spec.budget_period, spec.models)
    except ValueError as exc:
        raise key_exists(str(exc)) from None
    await _reload_keys(request)
    return JSONResponse({**key.public(), "key": secret}, status_code=201)


async def revoke_key(request: Request, name: str) -> Response:
    store = await admin_store(request)
    if not await anyio.to_thread.run_sync(store.revoke, name):
        raise key_not_found(name)
    await _reload_keys(request)  # a revoked key stops working now, not in a refresh
    return JSONResponse({"name": name, "revoked": True})


async def _reload_keys(request: Request) -> None:
    keys = gateway_of(request).keys
    if keys is not None:
        await anyio.to_thread.run_sync(keys.refresh)


