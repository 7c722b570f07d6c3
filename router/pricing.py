"""Pricing an action by what it adds to what the GPUs already run.

A backend's operating curve gives a request's joules at a concurrency n:

    J(P, C, n) = A(P, C) + B(P, C) / n

A(P, C) is the request's own work; B(P, C) is the batch's shared work (weight
reads, idle power) split among the n requests that run together. So:

- **alone** (the backend idle, nothing else busy on its device): J(P, C, 1);
- **joins a batch** (every replica of the backend busy; `margin`): its own
  work only, (n+1) J(n+1) - n J(n) = A(P, C), as if the batch ran anyway
  (with a batch profile in the curve, router/curves.py, that difference
  itself, never below A: joining a batch the engine runs poorly costs more;
  n is then every request its device has in flight, its neighbours' too:
  the batch it would run if it took them, not a dip while some run on the
  small model: priced at the dip, an 8B that is cheap at eight and dear at
  four sent a fifth of eight clients' requests small, H100, 27e7d8c);
- **shares a batch** (`share`): its share of the batch it makes,
  J(P, C, n+1), as if the requests sent there were what keeps it running;
- **beside another model** on the same device: two llama.cpp or vLLM
  processes on one GPU time-slice it. Its price is its own batch's price
  x (1 + colocation penalty), the penalty 1 by default;
- `prompt` (the default): by the prompt's length, margin and the full
  penalty up to SHORT_PROMPT_TOKENS, share and no penalty from
  LONG_PROMPT_TOKENS, linear between (what the mixed-load grid measured,
  below).

Neither margin nor share is right everywhere; measured in turns on an H100 at
83b3f8e (NVML, random-weight 1B/8B, 100 prompts a turn; docs/routing.md,
"Decisions under overlapping load"), energy saved against always-large:

| load | `margin`, x2 | `share`, no penalty | load-blind split |
|---|---|---|---|
| chat-traffic, 4 clients | 9% | 33% | 29% |
| chat-traffic, 8 clients | 8% | **-40%** | **-70%** |
| long-documents, 8 clients | 6% | 50% | 51% |

`margin` keeps almost everything on the busy 8B and is never much worse
than always-large; `share` mixes the models, which pays where the 8B's
batch is inefficient (long prompts, whose prefill is compute-bound; four
clients on that llama.cpp build, where a batch of four took longer per
step than one of eight) and costs 40% more where it batches well (short
prompts at eight). The curves (one model at a time, requests in
lock-step, n = 1 and 8) see neither case, so margin was the default: it
does no harm. Measured under mixed load since (`gpu-mixed-h100.json`,
docs/routing.md "One GPU under mixed load"): beside a batch of short
prompts the 1B cost 1.1-1.95x what the curves say (the x2 is about right),
beside long prompts 0.8-1.2x (no penalty). So `prompt` follows the prompt,
and replayed at 20658a3 (H100, eight clients, 50 prompts a turn, one turn
each beside two of `auto` as margin): long documents 54% less than
always-large (margin 15%, the split 46%), chat-traffic 4.4% less (margin
3.8%, the split 54% more). It is the default since.

A pair is not a batch (`share_at_most_in_flight`): a request that finds at
most that many requests in flight on its device (per replica) is priced at
its share, without the penalty, whatever `batching` says. Two clients keep
the 8B's batch at one or two, where its shared work is not paid anyway: in
closed loops on an H100 its requests cost 217 J at two clients against 234
J alone (the curve's lock-step pairs: ~123), and at two clients `share` and
the load-blind split used 46-47% less than always-large where the margin
side of `prompt` used 4% less (H100, nvml, varied answers, the H100's own
curves: `gpu-routing-chat-traffic-c2-split-varied-own-curves-h100.json`);
at eight the same share cost 71% more, so the rule stops at pairs. In turns
with and without it (53047e9, same H100 and curves, `-pairs-h100.json`):
46.0% against 6.6% less than always-large at two clients (the split
45.9%), 31.8% against 28.5% at four, 1.6% less against 0.9% more at
eight; expected quality 96.1%, 96.2%, 99.97% of always-large's. The
default since (1; 0 turns it off).

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
from router.record import record

Batching = Literal["margin", "share", "prompt"]
BATCHING: Batching = "prompt"
COLOCATION_PENALTY = 1.0
# `prompt` (the default): margin with the co-location penalty for a short
# prompt, share without it for a long one, linear between: the two prompt
# lengths of gpu-mixed-h100.json, where mixing the models cost 5-37% a
# request (~150 tokens) and saved 17-41% (~1,000 tokens).
SHORT_PROMPT_TOKENS = 150.0
LONG_PROMPT_TOKENS = 1000.0
# In flight on the device (per replica) up to which a request is priced at its
# share without the penalty, whatever the batching (0: the batching alone).
SHARE_AT_MOST_IN_FLIGHT = 1


def long_share(prompt_tokens: float) -> float:
    """0 for a short prompt, 1 for a long one, linear between."""
    return min(1.0, max(0.0, (prompt_tokens - SHORT_PROMPT_TOKENS)
                        / (LONG_PROMPT_TOKENS - SHORT_PROMPT_TOKENS)))


@dataclass(frozen=True)
class LoadPricing:
    """How load prices an action: `batching` (margin or share, above) and the
    co-location penalty beside another model's batch (x (1 + penalty))."""

    batching: Batching = BATCHING
    colocation_penalty: float = COLOCATION_PENALTY
    share_at_most_in_flight: int = SHARE_AT_MOST_IN_FLIGHT


@dataclass(frozen=True)
class Site:
    """Where a backend runs: how many replicas, and which other backends share
    a device with one of them."""

    replicas: int = 1
    neighbours: frozenset[str] = frozenset()


@record
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
        self.by_prompt = load.batching == "prompt"
        self.share_at_most = load.share_at_most_in_flight

    def price(self, curve: Curve, backend: str, prompt_tokens: float,
              completion_tokens: float, running: Mapping[str, int]) -> Price:
        site = self.sites.get(backend, Site())
        n = running.get(backend, 0)
        lead = self._lead(backend, n, site, running)
        # The batch it joins is what its device has in flight (its own and
        # its neighbours' requests): the batch this backend runs while the
        # traffic lasts, not a momentary dip (it only matters with a batch
        # profile; under the form a join costs its own work at any n)
        on_device = n + sum(running.get(o, 0) for o in site.neighbours)
        # how far toward `share` (and away from the penalty) this request is priced
        w = long_share(prompt_tokens) if self.by_prompt else 1.0 if self.share else 0.0
        pair = on_device <= self.share_at_most * site.replicas
        if pair:
            w = 1.0  # a pair is not a batch (above)
        if lead is not None:
            joules = curve.joules(prompt_tokens, completion_tokens, n + 1)
            if pair:
                penalty = 0.0
            elif self.by_prompt:
                penalty = self.penalty * (1.0 - w)
            else:
                penalty = self.penalty
            return Price(joules * (1.0 + penalty), f"beside {lead}")
        if n >= site.replicas:
            batch = math.ceil(n / site.replicas)
            share = curve.joules(prompt_tokens, completion_tokens, n / site.replicas + 1) \
                if w > 0.0 else 0.0
            margin = curve.joins(prompt_tokens, completion_tokens, on_device / site.replicas) \
                if w < 1.0 else 0.0
            joules = w * share + (1.0 - w) * margin
            if w >= 0.5:
                return Price(joules, f"shares a batch of {batch + 1}")
            return Price(joules, f"joins a batch of {batch}")
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
