"""The ASGI server under the same app, in turns: uvicorn (httptools, uvloop:
what joulegate runs) against granian (Rust HTTP, ASGI interface, uvloop),
both serving the bare pass-through (bench/passthrough.py) in front of the
fixed-answer nginx upstream, wrk at one and fifty connections.

    pip install granian   # not a joulegate dependency
    python -m bench.server_ab [--rounds 3] [--seconds 8]
        ->  bench/results/server-ab.json

A faster server would lift the gateway and the pass-through alike; this asks
whether it is one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from app.tools.embedded import free_port
from bench.gateways import passthrough, start_nginx, stop_nginx, wrk
from bench.gpu_common import project_commit
from workers.local import wait_healthy

ROOT = Path(__file__).resolve().parent.parent
BODY = {"model": "x", "messages": [{"role": "user", "content": "What is the capital of France?"}]}


def servers(upstream: int, work: Path) -> dict[str, tuple[int, subprocess.Popen[bytes]]]:
    """Both servers on free ports, each with the pass-through app."""
    granian = shutil.which("granian", path=str(Path(sys.executable).parent)) \
        or shutil.which("granian")
    if granian is None:
        raise SystemExit("granian is not installed: pip install granian")
    (work / "ptapp.py").write_text("from bench.passthrough import make_app\n"
                                   f"app = make_app('http://127.0.0.1:{upstream}')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(work)]))
    log = (work / "granian.log").open("wb")
    pu, pg = free_port(), free_port()
    return {
        "uvicorn": (pu, passthrough(pu, upstream, work)),
        "granian": (pg, subprocess.Popen(
            [granian, "--interface", "asgi", "--loop", "uvloop", "--workers", "1",
             "--host", "127.0.0.1", "--port", str(pg), "--no-ws", "--log-level", "warning",
             "ptapp:app"], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=8)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="jg-server-ab-"))
    upstream = start_nginx(work)
    procs = servers(upstream, work)
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        for port, proc in procs.values():
            wait_healthy(f"http://127.0.0.1:{port}/readyz", 60, proc)
        names = list(procs)
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                for c in (1, 50):
                    res = wrk(f"http://127.0.0.1:{procs[name][0]}/v1/chat/completions", c,
                              args.seconds, BODY, work)
                    runs.setdefault(f"{name} c={c}", []).append(res)
                    print(r, name, c, res, flush=True)
    finally:
        for _, proc in procs.values():
            proc.kill()
        stop_nginx(work)

    def median(key: str, figure: str) -> float:
        return round(float(statistics.median(x[figure] for x in runs[key])), 3)

    summary = {k: {f: median(k, f) for f in ("req_per_s", "p50_ms", "p99_ms")} for k in runs}
    result = {
        "commit": project_commit(), "rounds": args.rounds, "seconds": args.seconds,
        "tool": "wrk -t1", "app": "bench/passthrough.py (FastAPI + aiohttp)",
        "versions": {"granian": _version("granian"), "uvicorn": _version("uvicorn")},
        "runs": runs, "medians": summary,
        "granian_over_uvicorn": {
            f"c={c}": {"req_per_s": round(summary[f"granian c={c}"]["req_per_s"]
                                          / summary[f"uvicorn c={c}"]["req_per_s"], 3),
                       "p50": round(summary[f"granian c={c}"]["p50_ms"]
                                    / summary[f"uvicorn c={c}"]["p50_ms"], 3)}
            for c in (1, 50)},
    }
    out = ROOT / "bench" / "results" / "server-ab.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["granian_over_uvicorn"], indent=2))


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    main()
