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

`share` batching (routing.batch_pricing, not the default until measured at
eight clients): a request joining a batch pays its share of the batch it
makes, J(P, C, n+1), not the margin. Under a closed loop of clients a batch
runs because requests keep joining it, so its shared work is paid by them;
priced at the margin the large model looks nearly free under load and gets
everything. At four clients on an H100 the load-blind split (every prompt to
its idle-GPU action) used 25.7% less than always-large and 30% less than
the margin-priced router (docs/routing.md, "Decisions under overlapping
load"); `share` with no co-location penalty makes the split's decisions there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from router.curves import Curve

COLOCATION_PENALTY = 1.0
Batching = Literal["margin", "share"]


@dataclass(frozen=True)
class LoadPricing:
    """How load prices an action: `batching` (margin or share, above) and the
    co-location penalty beside another model's batch (x (1 + penalty))."""

    batching: Batching = "margin"
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
