"""The energy report over a window of the usage ledger: what each kind of
request cost, and how far that is from what token counts predict.

Per category, per backend, and per category within each backend:

- requests, prompt and answer tokens, joules (net of idle and gross, with
  their sources), joules per token, loop-guard stops;
- **the seed's divergence** (joulegate's first experiment: energy does not
  follow tokens by kind of prompt): against a reference category, the token
  multiplier (answer tokens per request over the reference's) and the energy
  multiplier (gross joules per request over the reference's);
  divergence = |energy multiplier - token multiplier| / token multiplier.
  Within one backend, so that routing between models does not pass for it;
- **three predictions of the same requests' gross joules**: a tokens x
  constant model (the backend's joules per token over the whole window), the
  backend's operating curve with each request alone (prompt, answer and their
  product: the context each decode token attends to), and what was measured.
  Where measured/curve stays near 1 and measured/token-linear does not, the
  divergence is context length; where both are off, it is batching (requests
  ran beside others, cheaper than alone) or something the curves do not hold.

Requests without an energy figure (metering failed) count as requests and
tokens, and are left out of every joule figure and prediction. Pure: rows of
sums in, a dict out (app/tenancy/spend.py sums them in the database).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from router.curves import Curve

SUMS = ("requests", "prompt_tokens", "completion_tokens", "energy_net_j", "energy_gross_j",
        "metered", "metered_prompt_tokens", "metered_completion_tokens",
        "metered_prompt_x_completion", "loop_stops")


def curve_alone_j(curve: Curve, requests: float, prompt: float, completion: float,
                  prompt_x_completion: float) -> float:
    """The curve's joules for requests run alone (n = 1), from sums: the curve
    is linear in 1, P, C and P C (router/curves.py), times its batch
    profile's factor at one."""
    b = curve.coef
    return (b[0] * requests + (b[1] + b[6]) * prompt / 1e3 + (b[2] + b[4]) * completion / 1e3
            + (b[3] + b[5]) * prompt_x_completion / 1e6) * curve.batch_factor(1)


def build_report(groups: Iterable[Mapping[str, Any]], curves: Mapping[str, Curve],
                 reference: str | None = None) -> dict[str, Any]:
    """The report of `groups` (SpendLedger.report_groups rows)."""
    rows = [dict(g) for g in groups]
    per_backend = _totals(rows, ("backend",))
    rate = {b: t["energy_gross_j"] / max(1, t["metered_prompt_tokens"]
                                         + t["metered_completion_tokens"])
            for (b,), t in per_backend.items()}
    for r in rows:  # the predictions, summed per group as the rows are
        tokens = r["metered_prompt_tokens"] + r["metered_completion_tokens"]
        r["token_linear_j"] = rate.get(r["backend"], 0.0) * tokens
        curve = curves.get(str(r["backend"]))
        r["curve_alone_j"] = None if curve is None else curve_alone_j(
            curve, r["metered"], r["metered_prompt_tokens"], r["metered_completion_tokens"],
            r["metered_prompt_x_completion"])
    by_category = _totals(rows, ("category",))
    ref = reference or _busiest(by_category)
    out_categories = {c: _figures(t, by_category.get((ref,))) for (c,), t in
                      sorted(by_category.items(), key=lambda kv: str(kv[0][0]))}
    within: dict[str, dict[str, Any]] = {}
    pairs = _totals(rows, ("backend", "category"))
    for (backend, category), t in sorted(pairs.items(), key=lambda kv: tuple(map(str, kv[0]))):
        mine = {k[1]: v for k, v in pairs.items() if k[0] == backend}
        base = mine.get(ref) or mine.get(_busiest({(k,): v for k, v in mine.items()}) or "")
        within.setdefault(str(backend), {})[str(category)] = _figures(t, base)
    divergence = {b: _mean([f["divergence"] for f in cats.values()
                            if f["divergence"] is not None]) for b, cats in within.items()}
    return {
        "reference_category": ref,
        "totals": _figures(_sum(rows), None),
        "by_category": out_categories,
        "by_backend": {str(b): _figures(t, None) for (b,), t in sorted(
            per_backend.items(), key=lambda kv: str(kv[0][0]))},
        "by_backend_category": within,
        "mean_divergence_by_backend": divergence,
        "definitions": {
            "divergence": "|energy multiplier - token multiplier| / token multiplier, "
                          "against the reference category within the same backend",
            "token_multiplier": "answer tokens per request / the reference's",
            "energy_multiplier": "gross joules per request / the reference's",
            "token_linear_j": "the backend's gross joules per token over the window x "
                              "these requests' tokens",
            "curve_alone_j": "the backend's operating curve, each request alone "
                             "(gross; an estimate)",
            "measured_gross_j": "the usage ledger's gross joules (the figures' sources)",
        },
    }


def _totals(rows: list[dict[str, Any]], by: tuple[str, ...]
            ) -> dict[tuple[Any, ...], dict[str, Any]]:
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        key = tuple(r[k] if r[k] is not None else "unknown" for k in by)
        _add(out.setdefault(key, {}), r)
    return out


def _sum(rows: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {k: 0 for k in SUMS}
    total.update(token_linear_j=0.0, curve_alone_j=None, sources=set())
    for r in rows:
        _add(total, r)
    return total


def _add(into: dict[str, Any], r: Mapping[str, Any]) -> None:
    for k in SUMS:
        into[k] = into.get(k, 0) + (r[k] or 0)
    into["token_linear_j"] = into.get("token_linear_j", 0.0) + r.get("token_linear_j", 0.0)
    alone = r.get("curve_alone_j")
    # A curve's prediction covers a group only where every part of it has one.
    first = "sources" not in into or not into["sources"]
    if first or into.get("curve_alone_j") is not None:
        into["curve_alone_j"] = None if alone is None else (into.get("curve_alone_j") or 0.0) \
            + alone
    into.setdefault("sources", set()).add(str(r["source"]))


def _busiest(totals: Mapping[tuple[Any, ...], Mapping[str, Any]]) -> str | None:
    metered = [(-t["metered"], str(k[0])) for k, t in totals.items() if t["metered"]]
    return min(metered)[1] if metered else None  # ties: the first by name


def _figures(t: Mapping[str, Any], base: Mapping[str, Any] | None) -> dict[str, Any]:
    n, m = t["requests"], t["metered"]
    tokens = t["metered_prompt_tokens"] + t["metered_completion_tokens"]
    gross = t["energy_gross_j"]
    alone = t.get("curve_alone_j")
    linear = t.get("token_linear_j", 0.0)
    out: dict[str, Any] = {
        "requests": n, "prompt_tokens": t["prompt_tokens"],
        "completion_tokens": t["completion_tokens"],
        "energy_net_j": round(t["energy_net_j"], 3), "energy_gross_j": round(gross, 3),
        "sources": sorted(t["sources"] - {"unavailable"}) or ["unavailable"],
        "requests_without_energy": n - m,
        "joules_per_token": round(gross / tokens, 5) if tokens else None,
        "joules_per_answer_token": round(gross / t["metered_completion_tokens"], 5)
        if t["metered_completion_tokens"] else None,
        "loop_stops": t["loop_stops"], "loop_rate": round(t["loop_stops"] / n, 4) if n else None,
        "predictions": {
            "measured_gross_j": round(gross, 3),
            "token_linear_j": round(linear, 3),
            "curve_alone_j": None if alone is None else round(alone, 3),
            "measured_over_token_linear": round(gross / linear, 4) if linear else None,
            "measured_over_curve_alone": round(gross / alone, 4) if alone else None,
        },
        "token_multiplier": None, "energy_multiplier": None, "divergence": None,
    }
    if base is not None and m and base["metered"] and base["metered_completion_tokens"] \
            and base["energy_gross_j"]:
        tok = (t["metered_completion_tokens"] / m) / (base["metered_completion_tokens"]
                                                      / base["metered"])
        energy = (gross / m) / (base["energy_gross_j"] / base["metered"])
        out["token_multiplier"], out["energy_multiplier"] = round(tok, 4), round(energy, 4)
        out["divergence"] = round(abs(energy - tok) / tok, 4) if tok else None
    return out


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def table(report: Mapping[str, Any]) -> str:
    """The per-category report as a readable table."""
    head = (f"{'category':<11} {'requests':>8} {'prompt':>9} {'answer':>9} {'gross J':>11} "
            f"{'J/token':>9} {'tokens x':>8} {'energy x':>8} {'diverge':>8} "
            f"{'/linear':>8} {'/curve':>7} {'loops':>5}")
    lines = [head, "-" * len(head)]

    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    rows = [*report["by_category"].items(), ("all", report["totals"])]
    for name, f in rows:
        p = f["predictions"]
        lines.append(
            f"{name:<11} {f['requests']:>8} {f['prompt_tokens']:>9} "
            f"{f['completion_tokens']:>9} {f['energy_gross_j']:>11.1f} "
            f"{num(f['joules_per_token'], '.4f'):>9} {num(f['token_multiplier'], '.2f'):>8} "
            f"{num(f['energy_multiplier'], '.2f'):>8} {num(f['divergence'], '.1%'):>8} "
            f"{num(p['measured_over_token_linear'], '.2f'):>8} "
            f"{num(p['measured_over_curve_alone'], '.2f'):>7} {f['loop_stops']:>5}")
    sources = ", ".join(report["totals"]["sources"])
    lines.append(f"reference category: {report['reference_category']}; energy source: "
                 f"{sources}; /linear and /curve: measured over the tokens x constant and "
                 "the curve-alone predictions")
    devices = (report.get("devices") or {}).get("data") or {}
    for name, d in devices.items():  # a live gateway's: since it started
        share = d["tail_share_of_active"]
        lines.append(f"device {name} ({d['source']}), since start: {d['measured_j']:.1f} J "
                     f"measured = {d['idle_j']:.1f} idle + {d['attributed_j']:.1f} requests "
                     f"+ {d['tail_j']:.1f} tail" + (f" ({share:.1%} of active)"
                                                    if share is not None else ""))
    return "\n".join(lines)


def device_tails(views: Iterable[Any]) -> dict[str, Any]:
    """Each device's energy since its gateway started, split as the ledger
    books it: idle, attributed to requests, and the tail (above idle while
    no request ran: what a device keeps drawing after the last request of a
    burst). `views`: telemetry.metrics.DeviceView; none where an agent meters
    the devices (the agent's /metrics has the same split)."""
    out = {}
    for v in views:
        t = v.totals()
        active = t.measured_j - t.idle_j
        out[v.device] = {
            "host": v.host, "source": v.source, "measured_j": round(t.measured_j, 3),
            "idle_j": round(t.idle_j, 3), "attributed_j": round(t.attributed_j, 3),
            "tail_j": round(t.unattributed_j, 3),
            "tail_share_of_active": round(t.unattributed_j / active, 4) if active > 0 else None,
            "power_w": t.power_w, "idle_power_w": t.idle_power_w}
    return {"since": "gateway start", "data": out,
            "note": None if out else "metered by an agent: its /metrics has each device's "
                                     "idle, attributed and tail energy"}
