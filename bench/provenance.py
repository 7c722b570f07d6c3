"""The commit a result ran at, with the standard library only (so that
benchmarks run where nothing else is installed, as on a bare GPU host)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def project_commit() -> str:
    env_commit = os.environ.get("JOULEGATE_COMMIT")
    if env_commit:
        return env_commit
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
        # uncommitted changes to the code (results aside) are not that commit
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no",
                                  "--", ".", ":!bench/results"], cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout.strip()
        # and a module not yet added is code the commit does not hold
        changed += subprocess.run(["git", "ls-files", "--others", "--exclude-standard",
                                   "--", "*.py"], cwd=ROOT, check=True,
                                  capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}+uncommitted" if changed else head


def commit_of(rev: str) -> str:
    """The short hash `rev` names (an A/B's base, as the results file records
    it), or `rev` itself where git cannot say (the run is not lost for that)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT,
                             capture_output=True, text=True).stdout.strip()
    except OSError:
        out = ""
    return out or rev
