"""Who is asking: the API key of a request, its budget and rates, and the admin."""

from __future__ import annotations

import time

from fastapi import Request

from app.errors import admin_only, invalid_api_key, joule_budget_exceeded, rate_limited
from app.http.body import header
from app.http.gateway import Gateway, gateway_of
from app.tenancy.keys import ADMIN_ID, ApiKey, KeyStore
from app.tenancy.spend import period_end


async def authorize(gw: Gateway, request: Request, generates: bool = True,
                    rated: bool | None = None) -> ApiKey | None:
    """The request's API key (None when the gateway runs open); 401 without a
    valid one. For a request that `generates`: 429 with Retry-After when the
    key's energy budget is spent; for one that is `rated` (by default, those
    that generate): when it is over its rates."""
    if gw.keys is None or not gw.keys.active():
        return None
    scheme, _, secret = (header(request, b"authorization") or "").partition(" ")
    key = gw.keys.find(secret.strip()) if scheme.lower() == "bearer" and secret else None
    if key is None:
        raise invalid_api_key()
    if generates and key.joule_budget is not None and gw.spend is not None \
            and gw.spend.spent_j(key) >= key.joule_budget:
        raise joule_budget_exceeded(key.joule_budget, key.budget_period,
                                    period_end(key.budget_period, time.time()))
    if not (generates if rated is None else rated):
        return key
    refusal = await gw.admission.admit(key)
    if refusal is not None:
        raise rate_limited(refusal.limit, refusal.retry_after_s)
    return key


async def admin_store(request: Request) -> KeyStore:
    """The key store, for the admin key only (403 otherwise)."""
    gw = gateway_of(request)
    key = await authorize(gw, request, generates=False)
    if key is None or key.id != ADMIN_ID or gw.keys is None:
        raise admin_only()
    return gw.keys.store
