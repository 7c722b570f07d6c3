"""`joulegate report --gateway URL`: a live gateway's report (GET /v1/report),
which carries each device's tail energy since the gateway started."""

from __future__ import annotations

from typing import Any

import httpx


class Unavailable(Exception):
    """The gateway could not be reached, or refused the report."""


def live_report(gateway: str, since: str, reference: str | None, key: str | None
                ) -> dict[str, Any]:
    params = {"since": since, **({"reference": reference} if reference else {})}
    try:
        r = httpx.get(gateway.rstrip("/") + "/v1/report", params=params, timeout=30,
                      headers={"authorization": f"Bearer {key}"} if key else {})
    except httpx.HTTPError as exc:
        raise Unavailable(f"cannot reach {gateway}: {exc}") from None
    if r.status_code != 200:
        raise Unavailable(f"{gateway} answered {r.status_code}: {r.text[:300]}")
    out: dict[str, Any] = r.json()
    out.pop("object", None)
    return out
