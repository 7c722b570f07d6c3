"""What a forwarded request's bookkeeping costs the gateway: joulegate as it
is, against copies of this checkout with one part of its work taken out, and
the bare pass-through (bench/passthrough.py), in turns in front of the same
fixed-answer nginx (bench.gateways), wrk at `--connections`.

    python -m bench.without [--rounds 3 --seconds 6 --connections 50 --model small]
        [--part NAME ...]  ->  bench/results/without.json

The copies are measurements, not configurations: each is this checkout with
exact lines of `app/forward/exchange.py` replaced (PARTS; a line that is no
longer there stops the run, naming the part). What is taken out:

- `journal`: the usage journal's line written as an answer leaves (kill -9
  then loses the row);
- `usage row`: the row handed to the usage ledger (the database write, the
  journal's final-figure line);
- `all bookkeeping`: both, and everything the request does after its answer
  (metrics, token counts, the wait for its final energy figure);
- `all bookkeeping, records handed to another process`: the same, but each
  request's facts sent as one datagram to a process that only decodes them
  (not counted in the gateway's CPU): what the gateway would still pay if
  its records were kept elsewhere;
- `routed decision` (only when named, with `--model auto`): the router's
  decision made once per prompt text (`router/engine.py`), what `auto`
  would cost if deciding were free.

What is left beside the pass-through is the forward itself: parsing,
admission, planning, the worker exchange, the answer.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from app.tools.embedded import free_port
from bench.ab import MESSAGES, measure_gateway, median_of
from bench.gateways import joulegate, passthrough, start_nginx, stop_nginx
from bench.gpu_common import worktree_at
from workers.local import ROOT

EXCHANGE = "app/forward/exchange.py"
JOURNAL = ("                p.on_answered(row)\n", "                pass\n")
USAGE = [("                p.on_usage(row)\n", "                pass\n"),
         ("        p.on_usage(row if figure is None else row.with_figure(",
          "        (lambda _: None)(row if figure is None else row.with_figure(")]
AFTER = ("        asyncio.get_running_loop().call_soon(self._record, prompt, completion, "
         "ended_s, row)\n", "")
NO_ROW = ("        if self.count:  # on disk before the answer leaves: a kill -9 loses no row\n",
          "        if False:\n")
# The records handed away instead: one datagram per request (a tuple of the
# request's facts, orjson) to another process, which decodes it and does
# nothing else; what the gateway itself would still pay if its records were
# kept elsewhere.
SINK_HELPER = ("log = logging.getLogger(\"joulegate.exchange\")\n",
               "log = logging.getLogger(\"joulegate.exchange\")\n"
               "import socket as _socket\n"
               "_SINK = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)\n"
               "_SINK.setblocking(False)\n\n\n"
               "def _hand_away(record: bytes) -> None:\n"
               "    try:\n"
               "        _SINK.sendto(record, {sink!r})\n"
               "    except OSError:\n"
               "        pass\n")
HAND_AWAY = (AFTER[0], "        _hand_away(jsonio.dumps((time.time(), fw.decision.tier, "
             "fw.decision.backend, fw.route, fw.decision.category, self.status, prompt, "
             "completion, self.window, ended_s - fw.received_at, "
             "self.figure.net_j if self.figure else None)))\n")
SINK = """
import socket, sys, orjson
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
while True:
    orjson.loads(s.recv(65536))
"""
# The routed decision made once per prompt text, whatever the load (the bench
# sends one prompt): what `auto` would cost if deciding were free (`--model
# auto --part "routed decision"`).
ENGINE = "router/engine.py"
MEMO = [(ENGINE, "        a = self.assess(q)\n",
         "        memo = self.__dict__.setdefault(\"_memo\", {})\n"
         "        if not explain and q.text in memo:\n"
         "            return memo[q.text]  # type: ignore[no-any-return]\n"
         "        a = self.assess(q)\n"),
        (ENGINE, "        return _explained(d, choice, probs, cx) if explain else d\n",
         "        if not explain:\n"
         "            memo[q.text] = d\n"
         "        return _explained(d, choice, probs, cx) if explain else d\n")]


def _exchange(*patches: tuple[str, str]) -> list[tuple[str, str, str]]:
    return [(EXCHANGE, old, new) for old, new in patches]


# part -> (file, exact lines, what replaces them)
PARTS: dict[str, list[tuple[str, str, str]]] = {
    "journal": _exchange(JOURNAL), "usage row": _exchange(*USAGE),
    "all bookkeeping": _exchange(NO_ROW, AFTER),
    "all bookkeeping, records handed to another process": _exchange(NO_ROW, HAND_AWAY,
                                                                    SINK_HELPER),
    "routed decision": MEMO}
DEFAULT_PARTS = [p for p in PARTS if p != "routed decision"]


NOT_COPIED = shutil.ignore_patterns(".git")


def patched_copy(src: Path, dest: Path, patches: list[tuple[str, str, str]], what: str,
                 ignore: Any = NOT_COPIED) -> Path:
    """A copy of the tree `src` at `dest` with each (file, exact text, what
    replaces it) applied; text that is not in its file once stops the run,
    naming `what` (the part or variant) so its tool can be updated."""
    shutil.copytree(src, dest, ignore=ignore)
    for name, old, new in patches:
        path = dest / name
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"{what}: {old.strip()!r} is not in {name} once; "
                             "update the tool's patches")
        path.write_text(text.replace(old, new))
    return dest


def _copy_without(src: Path, part: str, dest: Path, sink: Path) -> Path:
    """A copy of the worktree `src` with `part` taken out (records handed away
    go to the datagram socket `sink`)."""
    return patched_copy(src, dest, [(name, old, new.replace("{sink!r}", repr(str(sink))))
                                    for name, old, new in PARTS[part]], part)


def _measure(start: Callable[[int], subprocess.Popen[bytes]], work: Path, seconds: int,
             connections: int, model: str) -> dict[str, Any]:
    port = free_port()
    return measure_gateway(start(port), port, work, seconds, connections,
                           {"model": model, "messages": MESSAGES})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--model", default="small", help="small (a forced tier) or auto")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "without.json")
    ap.add_argument("--part", action="append", choices=list(PARTS),
                    help="a part to take out (repeat; default: every part but the "
                         "routed decision)")
    args = ap.parse_args()
    parts = args.part or DEFAULT_PARTS
    work = Path(tempfile.mkdtemp(prefix="joulegate-without-"))
    runs: dict[str, list[dict[str, Any]]] = {}
    with worktree_at("HEAD", work / "head") as head:
        sink = work / "records.sock"
        roots = {"as is": head, **{f"without {p}": _copy_without(
            head, p, work / p.replace(" ", "-").replace(",", ""), sink) for p in parts}}
        receiver = subprocess.Popen([sys.executable, "-c", SINK, str(sink)])
        upstream = start_nginx(work)
        try:
            starts: dict[str, Callable[[int], subprocess.Popen[bytes]]] = {
                name: partial(joulegate, upstream=upstream, work=work, root=root)
                for name, root in roots.items()}
            starts["FastAPI pass-through"] = partial(passthrough, upstream=upstream, work=work)
            names = list(starts)
            for i in range(args.rounds):
                # a different one first each round: the VM drifts through a run
                for name in names[i % len(names):] + names[:i % len(names)]:
                    runs.setdefault(name, []).append(_measure(
                        starts[name], work, args.seconds, args.connections, args.model))
                    print(name, runs[name][-1], flush=True)
        finally:
            stop_nginx(work)
            receiver.kill()
    floor = median_of(runs["FastAPI pass-through"], "req_per_s")
    summary = {name: {"req_per_s_median": (rps := median_of(rs, "req_per_s")),
                      "vs_pass_through": round(rps / floor, 3) if rps and floor else None,
                      "cpu_ms_per_request_median": median_of(rs, "cpu_ms_per_request"),
                      "failed_runs": sum("error" in r for r in rs)}
               for name, rs in runs.items()}
    # what ran is HEAD's tree (copies of it), whatever this checkout holds uncommitted
    head_commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                 text=True, check=True).stdout.strip()
    result = {"commit": head_commit, "rounds": args.rounds, "seconds": args.seconds,
              "case": f"model {args.model}, non-streamed, wrk -t1 -c{args.connections}, "
                      "one gateway process",
              "taken_out_of": sorted({f for p in parts for f, _, _ in PARTS[p]}),
              "runs": runs, "summary": summary}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, s in summary.items():
        print(f"{name:60s} {s['req_per_s_median']} req/s  {s['vs_pass_through']}x  "
              f"{s['cpu_ms_per_request_median']} ms CPU, {s['failed_runs']} failed")


if __name__ == "__main__":
    main()
