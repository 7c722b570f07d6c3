"""Run a module under cProfile, profiling only between two signals: SIGUSR1
starts the profiler (on the main thread: the event loop's), SIGUSR2 stops
it, and the stats are written to OUT when the module returns (a clean exit).
So a benchmark profiles its loaded window alone, not the process's start.

    python -m bench.profiled OUT -m MODULE [ARGS...]
"""

from __future__ import annotations

import cProfile
import runpy
import signal
import sys
from types import FrameType


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit(__doc__)
    out, module, args = sys.argv[1], sys.argv[3], sys.argv[4:]
    profile = cProfile.Profile()

    def start(signum: int, frame: FrameType | None) -> None:
        profile.enable()

    def stop(signum: int, frame: FrameType | None) -> None:
        profile.disable()

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        profile.disable()
        profile.dump_stats(out)


if __name__ == "__main__":
    main()
