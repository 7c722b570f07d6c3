"""The parent side of an A/B whose measurement runs in a child process per
checkout (bench.ledger_cost, bench.decide_cost): the script run again with
`--child` against a checkout's packages, under valgrind's instruction count
where asked, and the checkouts taken in turns.

Imported by the parent only, never at a script's module level: the child
runs against a base checkout, which may be older than this module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

# The same dicts in every run, and no BLAS threads spinning beside the work:
# valgrind's counts then repeat to 0.001% (bench.decide_cost).
STEADY_ENV = {"PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1"}


def child_output(script: Path, root: Path, args: list[str], valgrind: bool) -> str:
    """`script --child ARGS` run with `root`'s packages first on the path."""
    env = dict(os.environ, PYTHONPATH=str(root), **STEADY_ENV)
    cmd = [sys.executable, str(script), "--child", *args]
    if valgrind:
        cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no",
               "--cachegrind-out-file=/dev/null", *cmd]
    out = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=True)
    return out.stdout + out.stderr


def instruction_refs(output: str) -> int:
    """The instructions valgrind counted, from a child's output."""
    line = next(x for x in output.splitlines() if "I" in x and "refs:" in x)
    return int(line.split(":")[1].replace(",", "").strip())


def in_turns(names: list[str], rounds: int) -> Iterator[str]:
    """Each name once a round, the first alternating between rounds."""
    for r in range(rounds):
        yield from (names if r % 2 == 0 else names[::-1])
