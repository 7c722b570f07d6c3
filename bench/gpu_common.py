"""Shared pieces of the GPU benchmarks: llama-server on CUDA, NVML, result files."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.provenance import commit_of as commit_of
from bench.provenance import project_commit as project_commit

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def worktree_at(rev: str, path: Path) -> Iterator[Path]:
    """A detached checkout of `rev` at `path` (an A/B's base), removed after."""
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(path), rev],
                   cwd=ROOT, check=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=ROOT,
                       check=False)


def start_llama(binary: str, model: str, port: int, parallel: int, ctx_per_slot: int,
                log: Path, threads: int | None = None, env: dict[str, str] | None = None
                ) -> subprocess.Popen[bytes]:
    cmd = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port),
           "-ngl", "999", "-np", str(parallel), "-c", str(ctx_per_slot * parallel),
           "--metrics", "--no-webui", "-b", "2048", "-ub", "512",
           *(["-t", str(threads)] if threads else [])]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited: see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    raise TimeoutError("llama-server did not become healthy")


def engine_build(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
        lines = (out.stdout + out.stderr).strip().splitlines()
        return "; ".join(ln for ln in lines if ln.startswith(("version", "built")))
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def merge_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Repeated runs of one mode: the mean of each figure, every run's joules,
    routes and failures counted over all runs."""
    from collections import Counter

    routes: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    for r in runs:
        routes.update(r["routes"])
        failed.update(r["failed"])
    k = len(runs)
    figures: tuple[str, ...] = ("joules", "wall_s", "expected_quality", "thinking_tokens")
    means: dict[str, Any] = {f: sum(r[f] for r in runs) / k for f in figures if f in runs[0]}
    merged = {**means, "joules_runs": [r["joules"] for r in runs], "routes": dict(routes),
              "failed": dict(failed), "answered": sum(r["answered"] for r in runs)}
    if "small_at" in runs[0]:  # per run: where in arrival order the small-tier requests were
        merged["small_at_runs"] = [r["small_at"] for r in runs]
    return merged


def plot_modes(path: Path, results: dict[str, Any], modes: list[str], colors: list[str],
               title: str | None = None) -> None:
    """Energy (bars) and expected quality (line) of each mode, at c=1 and c=8."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key in zip(axes, ("c1", "c8"), strict=True):
        r = results[key]["modes"]
        ax.bar(modes, [r[m]["joules"] / 1000 for m in modes], color=colors)
        ax.set_ylabel("energy, kJ (nvml)")
        ax.tick_params(axis="x", labelsize=8)
        ax2 = ax.twinx()
        ax2.plot(modes, [r[m]["expected_quality"] for m in modes], "ko-")
        ax2.set_ylim(0, 1)
        ax2.set_ylabel("expected quality")
        n = results[key].get("requests")
        ax.set_title(f"concurrency {key[1:]}" + (f" ({n} requests)" if n else ""))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def metered_run(nvml: Any, send: Callable[[httpx.AsyncClient, int, str], Awaitable[None]],
                      prompts: list[str]) -> tuple[float, float]:
    """(joules on the counter, wall seconds) of sending every prompt at once
    (the callers' semaphores bound the concurrency)."""
    import asyncio

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as client:
        await asyncio.sleep(1.0)
        e0, t0 = nvml.read().counter_j, time.monotonic()
        await asyncio.gather(*(send(client, i, t) for i, t in enumerate(prompts)))
        wall = time.monotonic() - t0
        await asyncio.sleep(0.3)  # let the counter step past the end
        return nvml.read().counter_j - e0, wall


async def timed_post(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                     headers: dict[str, str], failed: Counter[str]
                     ) -> tuple[httpx.Response, float] | None:
    """One chat request: (the response, its seconds per answer token, queueing
    included), or None with the failure counted."""
    t0 = time.perf_counter()
    try:
        r = await client.post(url, json=body, headers=headers, timeout=600)
    except httpx.HTTPError as exc:
        failed[type(exc).__name__] += 1
        return None
    if r.status_code != 200:
        failed[str(r.status_code)] += 1
        return None
    done = r.json()["usage"]["completion_tokens"]
    return r, (time.perf_counter() - t0) / max(1, done)


def per_token_figures(per_token: list[float]) -> dict[str, float | None]:
    """p50 and p99 of seconds per answer token."""
    xs = sorted(per_token)
    return {"s_per_token_p50": statistics.median(xs) if xs else None,
            "s_per_token_p99": xs[min(len(xs) - 1, int(0.99 * len(xs)))] if xs else None}


def loops_profile(path: Path, tier: str = "large") -> tuple[tuple[float, float], ...]:
    """The batch profile closed loops on `tier` alone measured: at each count
    of clients, the median measured-over-curves ratio over that at one client."""
    points = next(iter(json.loads(path.read_text())["points"].values()))
    other = "small" if tier == "large" else "large"
    by_k: dict[int, list[float]] = {}
    for p in points:
        k = p["clients"][tier]
        if k and not p["clients"][other] and p["measured_over_curves"]:
            by_k.setdefault(k, []).append(p["measured_over_curves"])
    one = statistics.median(by_k[1])
    return tuple((float(k), statistics.median(r) / one) for k, r in sorted(by_k.items()))


def profiled_curves(source: Path, loops: Path, large: str) -> tuple[Path, dict[str, Any]]:
    """A copy of the curves in `source` (a new temporary folder), the `large`
    shape's with the batch profile closed loops measured (`loops`, a
    gpu-loops-*.json of bench/gpu_mixed.py); and what was put there."""
    into = Path(tempfile.mkdtemp(prefix="jg-curves-"))
    shutil.copytree(source, into, dirs_exist_ok=True)
    path = into / f"{large}.json"
    curve = json.loads(path.read_text())
    curve["batch_profile"] = [list(pair) for pair in loops_profile(loops)]
    path.write_text(json.dumps(curve))
    return into, {"curve": large, "from": str(loops.relative_to(ROOT)
                                              if loops.is_relative_to(ROOT) else loops),
                  "batch_profile": curve["batch_profile"]}
