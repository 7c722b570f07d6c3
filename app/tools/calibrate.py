"""`joulegate calibrate`: measure each backend's operating curve.

Runs the gateway in this process (so the same samplers and ledgers meter the
requests as in production; on a GPU host, NVML), sends each backend requests
of swept prompt and completion lengths at each concurrency, reads every
request's final energy, fits joules = f(P, C, n) and writes one curves file
per backend. Requests use token-id prompts and `ignore_eos` (llama.cpp and
vLLM both accept them) so lengths are exactly what was asked.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from app.artifacts import save_curve
from app.catalog import Backend, Catalog
from app.factory import Seams
from app.tools.embedded import RunningGateway, run_gateway
from router.curves import Curve, Point, fit_curve


@dataclass(frozen=True)
class Sweep:
    prompts: list[int]
    completions: list[int]
    concurrency: list[int]
    repeat: int = 1
    token_id_low: int = 300
    token_id_high: int = 1000  # valid in every vocabulary of >= 1000 tokens
    # A tiny unmeasured request right before each point: on the H200 the first
    # request after even a short pause ran up to 10x slower and dearer (clocks
    # ramping up from idle), which is not the steady-state cost curves model.
    prewarm: bool = True


def _body(b: Backend, prompt: int, completion: int, rng: random.Random, sw: Sweep
          ) -> dict[str, Any]:
    return {"model": b.name,
            "prompt": [rng.randrange(sw.token_id_low, sw.token_id_high) for _ in range(prompt)],
            "max_tokens": completion, "ignore_eos": True, "cache_prompt": False,
            "temperature": 0}


async def _final(client: httpx.AsyncClient, gw: RunningGateway, eid: str) -> dict[str, Any]:
    fig: dict[str, Any] = {}
    for _ in range(200):
        fig = (await client.get(f"{gw.v1}/energy/{eid}")).json()
        if fig.get("final"):
            break
        await asyncio.sleep(0.05)
    return fig


async def _point(client: httpx.AsyncClient, gw: RunningGateway, b: Backend, p: int, c: int,
                 n: int, rng: random.Random, sw: Sweep) -> Point:
    bodies = [_body(b, p, c, rng, sw) for _ in range(n)]
    if sw.prewarm:
        (await client.post(gw.v1 + "/completions", json=_body(b, 16, 4, rng, sw),
                           timeout=300)).raise_for_status()
    t0 = time.monotonic()
    rs = await asyncio.gather(*(client.post(gw.v1 + "/completions", json=x, timeout=900)
                                for x in bodies))
    seconds = time.monotonic() - t0
    for r in rs:
        r.raise_for_status()
    figs = [await _final(client, gw, r.headers["x-joulegate-energy-id"]) for r in rs]
    joules = sum(float(f["gross_j"]) for f in figs) / n
    done = [r.json()["usage"]["completion_tokens"] for r in rs]
    return Point(p, round(sum(done) / n), n, joules, seconds)


async def _sweep(gw: RunningGateway, catalog: Catalog, sw: Sweep, backends: list[str],
                 quiet_s: float) -> dict[str, list[Point]]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    rng = random.Random(0)
    grid = [(p, c, n) for p in sw.prompts for c in sw.completions for n in sw.concurrency
            for _ in range(sw.repeat)]
    out: dict[str, list[Point]] = {name: [] for name in backends}
    async with httpx.AsyncClient() as client:
        await asyncio.sleep(quiet_s)  # the ledgers learn idle power while nothing runs
        with Progress(TextColumn("{task.description}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                      TextColumn("{task.fields[last]}")) as bar:
            for name in backends:
                b = catalog.backend(name)
                assert b is not None
                task = bar.add_task(f"calibrating {name}", total=len(grid), last="")
                # Warm-up: the first request of each shape builds kernels and graphs
                # (seen on the H200: 2 s for a 0.3 s request), which is not its cost.
                for p in sw.prompts:
                    for n in sw.concurrency:
                        await asyncio.gather(*(client.post(
                            gw.v1 + "/completions", json=_body(b, p, 8, rng, sw), timeout=300)
                            for _ in range(n)))
                for p, c, n in grid:
                    pt = await _point(client, gw, b, p, c, n, rng, sw)
                    out[name].append(pt)
                    bar.update(task, advance=1,
                               last=f"P={p} C={c} n={n}: {pt.joules:.2f} J in {pt.seconds:.2f}s")
    return out


async def _workers_say(catalog: Catalog, names: list[str]
                       ) -> dict[str, tuple[str | None, str | None]]:
    """Each backend's weights and engine build, as its workers report them
    (llama-server's /props), for the curve to record."""
    from app.upstream.client import Upstream, httpx_transport
    from app.upstream.contexts import worker_says

    upstream = Upstream(httpx_transport(5.0, 5.0))
    try:
        out = {}
        for name in names:
            b = catalog.backend(name)
            assert b is not None
            said = await worker_says(upstream, b)
            out[name] = (said.weights, said.build)
        return out
    finally:
        await upstream.aclose()


def calibrate(catalog: Catalog, sw: Sweep, out_dir: Path, backends: list[str] | None = None,
              quiet_s: float = 4.0, sample_hz: float = 20.0) -> dict[str, Curve]:
    names = backends or [b.name for b in catalog.backends]
    seams = Seams()
    with run_gateway(catalog, seams, sample_hz=sample_hz,
                     first_byte_timeout_seconds=900, between_chunks_timeout_seconds=900) as gw:
        points = asyncio.run(_sweep(gw, catalog, sw, names, quiet_s))
        devices = {d.spec.name: d for d in seams.devices}
        said = asyncio.run(_workers_say(catalog, names))
    curves = {}
    for name, pts in points.items():
        b = catalog.backend(name)
        assert b is not None
        dev = devices[b.replicas[0].device]
        weights, build = said.get(name, (None, None))
        meta = {"backend": name, "device": dev.reader.name, "engine": b.kind, "model": b.model,
                "source": dev.reader.source,
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "weights": weights or b.weights or "unknown",
                "engine_build": build or "unknown"}
        curve = fit_curve(pts, meta)
        curve = replace(curve, fit={**curve.fit, "measurements": [asdict(p) for p in pts]})
        save_curve(curve, out_dir / f"{name}.json")
        curves[name] = curve
    return curves
