"""Pricing an action by what it adds to what the GPUs already run.

A backend's operating curve gives a request's joules at a concurrency n:

    J(P, C, n) = A(P, C) + B(P, C) / n

A(P, C) is the request's own work; B(P, C) is the batch's shared work (weight
reads, idle power) split among the n requests that run together. So:

- **alone** (the backend idle, nothing else busy on its device): J(P, C, 1);
- **shares a batch** (every replica of the backend busy; the default,
  `share`): its share of the batch it makes, J(P, C, n+1). Under a closed
  loop of clients a batch runs because requests keep joining it, so its
  shared work is paid by them. Priced at the margin instead (`margin`: (n+1)
  J(n+1) - n J(n) = A(P, C), "joins a batch"), the large model looks nearly
  free under load and gets everything: at four clients on an H100 that router
  sent 98% large and used 6.2% more than always-large, where the load-blind
  split (every prompt to its idle-GPU action) used 25.7% less (e14f8ee, NVML,
  docs/routing.md "Decisions under overlapping load"); `share` makes the
  split's decisions there and still sends nearly everything large at eight
  (`python -m bench.burst_routes`; `--margin` for the old pricing);
- **beside another model** on the same device: two llama.cpp or vLLM
  processes on one GPU time-slice it. Its price is J(P, C, n+1) x (1 +
  colocation penalty), the penalty 0 by default. A thin mix beside a full
  batch is costly: at concurrency 8 on the H200, 10 requests of 200 sent
  to the 1B cost 18% more than always-8B (ba81e54) and 26 of 200, with the
  1B's batch priced at the margin too, 59% more (3c205a8; single turns,
  auto's first). A wide one is not: at four clients the split sent 68 of
  100 small and used 25.7% less. With `share`, the 8B's batch of eight is
  cheaper than a 1B alone for the short prompts of both workloads, so at
  eight clients nearly everything stays large (the thin mix does not
  form); a penalty above ~0.19 would send everything large at four from
  an idle 1B as well (H200 curves, a 200-token prompt and a 64-token
  answer: the 1B alone 44.1 J, the 8B as one of five 52.3 J). Easy
  requests with long prompts can still go to the 1B beside a full 8B
  batch: that case is not measured.

On a shared device the *lead* is the busy backend of the highest tier: the
largest model serves every request acceptably, so while it runs the others
price themselves beside it. Pure arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from router.curves import Curve

Batching = Literal["margin", "share"]
BATCHING: Batching = "share"
COLOCATION_PENALTY = 0.0


@dataclass(frozen=True)
class LoadPricing:
    """How load prices an action: `batching` (margin or share, above) and the
    co-location penalty beside another model's batch (x (1 + penalty))."""

    batching: Batching = BATCHING
    colocation_penalty: float = COLOCATION_PENALTY


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
                 load: LoadPricing | None = None) -> None:
        load = load or LoadPricing()
        self.sites = sites
        self.rank = rank  # backend -> its tier's place, cheapest first
        self.penalty = load.colocation_penalty
        self.share = load.batching == "share"

    def price(self, curve: Curve, backend: str, prompt_tokens: float,
              completion_tokens: float, running: Mapping[str, int]) -> Price:
        site = self.sites.get(backend, Site())
        n = running.get(backend, 0)
        lead = self._lead(backend, n, site, running)
        if lead is not None:
            joules = curve.joules(prompt_tokens, completion_tokens, n + 1)
            return Price(joules * (1.0 + self.penalty), f"beside {lead}")
        if n >= site.replicas:
            batch = math.ceil(n / site.replicas)
            if self.share:
                return Price(curve.joules(prompt_tokens, completion_tokens, n / site.replicas + 1),
                             f"shares a batch of {batch + 1}")
            return Price(curve.joules(prompt_tokens, completion_tokens, math.inf),
                         f"joins a batch of {batch}")
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
