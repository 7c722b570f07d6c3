"""Where a loaded gateway's event loop spends a request, function by
function: `joulegate serve` under cProfile (its main thread: the event loop,
during the load alone: bench.profiled starts and stops the profiler by signal)
in front of the fixed-answer nginx upstream (bench.gateways) while wrk sends
non-streamed chat requests; per request, each function's own and inclusive
time, and the shares of the request's stages.

    python -m bench.cprofile_gateway [--model small] [--connections 50] [--seconds 10]
        ->  bench/results/cprofile-<model>-c<N>.json

cProfile slows every Python call (about 2x here), so the times are inflated
and only their shares compare; the sampling profile (bench.profile_gateway)
does not slow the process but, under uvloop, loses the callers of resumed
coroutines. A coroutine resumed counts as a call each time, so calls are
given per request and times are summed over them. Needs nginx-light and wrk.
"""

from __future__ import annotations

import argparse
import json
import pstats
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.gpu_common import project_commit
from bench.profile_gateway import loaded_gateway

ROOT = Path(__file__).resolve().parent.parent
# Stages of a request, by the function whose inclusive time is the stage's.
STAGES = {
    "intake (guard, key, body, validation, plan: the router under auto)": [
        ("app/http/guard.py", "refusal"), ("app/http/chat.py", "_arrived"),
        ("app/http/chat.py", "_chat_query"), ("app/forward/planner.py", "plan")],
    "worker exchange: open and send": [("app/forward/exchange.py", "begin")],
    "worker exchange: read and assemble the answer": [("app/forward/exchange.py", "events"),
                                                      ("app/forward/assemble.py", "add"),
                                                      ("app/forward/assemble.py", "result")],
    "end (pool, provisional figure, journal)": [("app/forward/exchange.py", "end")],
    "final figure's bookkeeping": [("app/metering/meter.py", "give_spread")],
    "response out (starlette's Response, uvicorn's writes)": [
        ("starlette/responses.py", "__call__")],
}
# Calls made exactly once per request: the request count.
ONCE = ("app/http/body.py", "json_body")


def per_request(stats: pstats.Stats, top: int = 40) -> dict[str, Any]:
    """Own and inclusive microseconds per request of our functions and the
    largest others, and the stages' shares of the whole request."""
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = \
        stats.stats  # type: ignore[attr-defined]
    once = [v[1] for (f, _, n), v in raw.items() if f.endswith(ONCE[0]) and n == ONCE[1]]
    requests = once[0] if once else 0
    if not requests:
        raise SystemExit("no request reached the gateway")

    def where(f: str) -> str:
        return f.split("site-packages/")[-1].replace(str(ROOT) + "/", "")

    rows = sorted(raw.items(), key=lambda kv: -kv[1][2])
    functions = [{"function": f"{name} ({where(f)}:{line})",
                  "own_us": round(tt / requests * 1e6, 1),
                  "inclusive_us": round(ct / requests * 1e6, 1),
                  "calls": round(nc / requests, 2)}
                 for (f, line, name), (_, nc, tt, ct, _) in rows[:top] if nc >= requests / 2]

    def inclusive(path: str, name: str) -> float:
        return sum(v[3] for (f, _, n), v in raw.items() if f.endswith(path) and n == name)

    # A request's work outside its ASGI call: the final figure's bookkeeping,
    # and under load the routed decisions made together once per loop turn.
    whole = (inclusive("app/http/asgi.py", "__call__")
             + inclusive("app/metering/meter.py", "give_spread")
             + inclusive("app/forward/turn.py", "_run_all"))
    stages = {stage: round(sum(inclusive(p, n) for p, n in parts) / whole, 3)
              for stage, parts in STAGES.items()}
    rest = "the rest (the layers between them: forwarding, watching, headers, the JSON out)"
    stages[rest] = round(1 - sum(stages.values()), 3)
    return {"requests": requests, "inclusive_us_per_request_whole":
            round(whole / requests * 1e6, 1), "stage_shares": stages,
            "functions_by_own_time": functions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="small", help="small (forced tier) or auto")
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    prof = Path(tempfile.mkdtemp(prefix="jg-cprofile-")) / "gateway.prof"
    with loaded_gateway(args.model, args.connections, 2, stop=signal.SIGINT,
                        python=[sys.executable, "-m", "bench.profiled", str(prof)]
                        ) as (proc, load_for):
        proc.send_signal(signal.SIGUSR1)  # the loaded window only: not the start
        load = load_for(args.seconds)
        proc.send_signal(signal.SIGUSR2)
    result = {"commit": project_commit(), "model": args.model, "connections": args.connections,
              "load_under_cprofile": load,
              "note": "cProfile inflates every Python call (~2x): compare shares, not times; "
                      "the event loop's thread only, during the load alone (bench.profiled); "
                      "functions called less than once per two requests left out",
              **per_request(pstats.Stats(str(prof)))}
    out = ROOT / "bench" / "results" / f"cprofile-{args.model}-c{args.connections}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "functions_by_own_time"},
                     indent=2))


if __name__ == "__main__":
    main()
