"""Pricing an action by what it adds to what the GPUs already run.

A backend's operating curve gives a request's joules at a concurrency n:

    J(P, C, n) = A(P, C) + B(P, C) / n

A(P, C) is the request's own work; B(P, C) is the batch's shared work (weight
reads, idle power) split among the n requests that run together. So:

- **alone** (the backend idle, nothing else busy on its device): J(P, C, 1);
- **joins a batch** (every replica of the backend busy): the marginal joules
  (n+1) J(n+1) - n J(n) = A(P, C): the shared part is paid already;
- **beside another model** on the same device: two llama.cpp or vLLM
  processes on one GPU time-slice it, so a request there also delays the
  other model's batch by about its own running time. Its price is J(P, C, n+1)
  x (1 + COLOCATION_PENALTY). Measured on the H200 at ba81e54 (`git show
  10d0060:bench/results/gpu-routing.json`): at concurrency 8, 10 requests sent
  to the 1B beside the 8B's batch cost 1,231 J (NVML) more than the always-8B
  run; this model predicts 1,098 J, and the pricing that ignored it cost 18%
  more than always-8B.

On a shared device the *lead* is the busy backend of the highest tier: the
largest model serves every request acceptably, so while it runs the others
yield to it rather than run beside it. Pure arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from router.curves import Curve

COLOCATION_PENALTY = 1.0


@dataclass(frozen=True)
class Site:
    """Where a backend runs: how many replicas, and which other backends share
    a device with one of them."""

    replicas: int = 1
    neighbours: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Price:
    joules: float
    note: str  # "alone", "joins a batch of 7", "beside large-8b"


class Pricing:
    def __init__(self, sites: Mapping[str, Site], rank: Mapping[str, int],
                 penalty: float = COLOCATION_PENALTY) -> None:
        self.sites = sites
        self.rank = rank  # backend -> its tier's place, cheapest first
        self.penalty = penalty

    def price(self, curve: Curve, backend: str, prompt_tokens: float,
              completion_tokens: float, running: Mapping[str, int]) -> Price:
        site = self.sites.get(backend, Site())
        n = running.get(backend, 0)
        lead = self._lead(backend, n, site, running)
        if lead is not None:
            joules = curve.joules(prompt_tokens, completion_tokens, n + 1)
            return Price(joules * (1.0 + self.penalty), f"beside {lead}")
        if n >= site.replicas:
            return Price(curve.joules(prompt_tokens, completion_tokens, math.inf),
                         f"joins a batch of {math.ceil(n / site.replicas)}")
        return Price(curve.joules(prompt_tokens, completion_tokens, 1), "alone")

    def _lead(self, backend: str, n: int, site: Site, running: Mapping[str, int]
              ) -> str | None:
        """The busy neighbour this backend would run beside, if one leads the device."""
        busy = [o for o in site.neighbours if running.get(o, 0) > 0]
        if not busy:
            return None
        lead = max(busy, key=lambda o: (self.rank.get(o, 0), running[o], o))
        mine = (self.rank.get(backend, 0), n, backend)
        if n > 0 and mine > (self.rank.get(lead, 0), running[lead], lead):
            return None
        return lead
