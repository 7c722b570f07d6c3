"""The mixed workload lives in app/tools/workload.py (the router's quality targets
are calibrated on it); re-exported for the benchmarks."""

from app.tools.workload import MIX, mixed_prompts

__all__ = ["MIX", "mixed_prompts"]
