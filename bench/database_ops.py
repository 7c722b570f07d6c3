"""The usage ledger's and key store's database work: this checkout against an
earlier commit, in turns (the machine's speed drifts between runs).

    python -m bench.database_ops --base d37bf4d [--postgres postgresql://...]
        ->  bench/results/database-ops.json

Each turn runs a child process on one side's code: 20 transactions of 200
usage rows (what the writer thread commits at once) and 200 one-row SELECTs
(a spend reload). All of it runs on the gateway's own threads, never on a
request's path; what it costs shows as GIL time those threads take.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.gpu_common import project_commit, worktree_at
from workers.local import ROOT

CHILD = r"""
import json, sys, tempfile, time
try:  # the layout before app/ had packages
    from app.database import Database
    from app.spend import COLUMNS
except ImportError:
    from app.tenancy.database import Database
    from app.tenancy.spend import COLUMNS
import app
assert app.__path__[0].startswith(sys.argv[2]), app.__path__
url = sys.argv[1] if sys.argv[1] != "sqlite" else f"sqlite:///{tempfile.mkdtemp()}/j.db"
db = Database.open(url)
# the 15 columns every layout has, then None for the optional ones a later
# layout added (request id, final flag, model, saved joules, cached tokens)
row = (time.time(), "k", "n", "auto", "small", "b", "direct", "chat", "ok", 10, 5, 1.0, 2.0,
       "nvml", 0.01)
row += (None,) * (len(COLUMNS) - len(row))
inserts, selects = [], []
for _ in range(20):
    t = time.perf_counter(); db.insert("usage", COLUMNS, [row] * 200)
    inserts.append(time.perf_counter() - t)
for _ in range(200):
    t = time.perf_counter(); db.execute("SELECT COUNT(*) FROM usage")
    selects.append(time.perf_counter() - t)
db.close()
print(json.dumps({"insert_200_rows_ms": 1000 * sorted(inserts)[10],
                  "select_ms": 1000 * sorted(selects)[100]}))
"""


def _turn(root: Path, url: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-c", CHILD, url, str(root)], cwd=root, env=env,
                         check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the earlier commit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", help="postgresql://... (a database to write into)")
    args = parser.parse_args()
    urls = ["sqlite", *([args.postgres] if args.postgres else [])]
    result: dict[str, Any] = {"commit": project_commit(), "base": args.base, "rounds": []}
    with tempfile.TemporaryDirectory() as tmp, worktree_at(args.base, Path(tmp) / "base") as base:
        for _ in range(args.rounds):
            turn = {}
            for url in urls:
                kind = "sqlite" if url == "sqlite" else "postgresql"
                turn[kind] = {"base": _turn(base, url), "this": _turn(ROOT, url)}
            result["rounds"].append(turn)
    result["median"] = {
        kind: {side: {m: round(statistics.median(r[kind][side][m] for r in result["rounds"]), 4)
                      for m in ("insert_200_rows_ms", "select_ms")} for side in ("base", "this")}
        for kind in result["rounds"][0]}
    out = ROOT / "bench" / "results" / "database-ops.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median"], indent=2))


if __name__ == "__main__":
    main()
