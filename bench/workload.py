"""The mixed workload lives in app/workload.py (the router's quality targets
are calibrated on it); re-exported for the benchmarks."""

from app.workload import MIX, mixed_prompts

__all__ = ["MIX", "mixed_prompts"]
