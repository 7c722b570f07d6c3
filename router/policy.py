"""The policy: which action gives the quality this request needs for the fewest joules.

An action is a tier's backend with a strategy (direct or cot). For each, the
expected quality comes from the quality table weighted by the category
probabilities, the expected joules from the backend's operating curve at the
expected completion length, priced by what the backends run now
(router.pricing: alone, joining a batch, or beside another model). Modes:

- max-quality: the best expected quality (ties: fewer joules);
- balanced: the fewest joules among actions within `tolerance` (relative) of
  the best quality;
- min-energy: the fewest joules (ties: better quality).

`max_joules` removes actions expected to cost more; if none is left, the
cheapest is taken and the reason says the cap could not be met.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from router.curves import Curve
from router.decision import Policy as PolicyName
from router.pricing import Pricing, Site
from router.quality import ExpectedLengths, QualityTable, action

COT_PROMPT_TOKENS = 32  # the step-by-step instruction added to the prompt


@dataclass(frozen=True)
class ActionSpec:
    tier: str
    backend: str
    strategy: str  # "direct" | "cot"
    reasoning: bool = False

    @property
    def key(self) -> str:
        return action(self.tier, self.strategy)


@dataclass(frozen=True)
class Candidate:
    spec: ActionSpec
    expected_quality: float
    expected_joules: float | None
    completion_tokens: int
    pricing: str = ""  # how its joules were priced (router.pricing): alone, joins, beside


@dataclass(frozen=True)
class Choice:
    chosen: Candidate
    reason: str
    candidates: tuple[Candidate, ...]
    cap_met: bool | None = None  # None: no joule cap asked


@dataclass(frozen=True)
class Caps:
    direct_max_tokens: int = 512
    cot_max_tokens: int = 1024
    thinking_budget: int = 512


def _cost(c: Candidate, rank: Mapping[str, int]) -> float:
    # Without a curve, fall back to the tier order (cheapest first in models.yaml).
    return c.expected_joules if c.expected_joules is not None else 1e12 * (1 + rank[c.spec.tier])


class Policy:
    def __init__(self, actions: list[ActionSpec], quality: QualityTable,
                 lengths: ExpectedLengths, curves: Mapping[str, Curve], tiers: list[str],
                 tolerance: float = 0.05, caps: Caps = Caps(),
                 sites: Mapping[str, Site] | None = None) -> None:
        self.actions = actions
        self.quality = quality
        self.lengths = lengths
        self.curves = curves
        self.tolerance = tolerance
        self.caps = caps
        self._rank = {t: i for i, t in enumerate(tiers)}
        self.pricing = Pricing(sites or {}, {a.backend: self._rank[a.tier] for a in actions})
        # What pricing an action needs that no request changes: its key, its token
        # cap, the prompt tokens its strategy adds, its backend's curve.
        self._plans = [(a, a.key, caps.cot_max_tokens if a.strategy == "cot"
                        else caps.direct_max_tokens,
                        COT_PROMPT_TOKENS if a.strategy == "cot" and not a.reasoning else 0,
                        curves.get(a.backend)) for a in actions]

    def candidates(self, probs: Mapping[str, float], prompt_tokens: int,
                   max_tokens: int | None, concurrency: Mapping[str, int],
                   quality: Mapping[str, float] | None = None) -> list[Candidate]:
        """Every action, priced. `quality`: this request's expected quality per
        action (the complexity model); without it, the category table's."""
        out = []
        for a, key, cap, extra, curve in self._plans:
            expected = self.lengths.expected(probs, key)
            limit = min(max_tokens, cap) if max_tokens else cap
            tokens = int(min(expected, limit))
            price = self.pricing.price(curve, a.backend, prompt_tokens + extra, tokens,
                                       concurrency) if curve else None
            q = quality[key] if quality is not None and key in quality \
                else self.quality.expected(probs, key)
            out.append(Candidate(a, q, price.joules if price else None, tokens,
                                 price.note if price else "no curve"))
        return out

    def choose(self, cands: list[Candidate], mode: PolicyName,
               max_joules: float | None, per_query_tolerance: float | None = None) -> Choice:
        """`per_query_tolerance` (absolute, from a quality target) replaces the
        relative `tolerance` of `balanced` when qualities are per query."""
        pool = cands
        note = ""
        cap_met = None
        if max_joules is not None:
            within = [c for c in cands if c.expected_joules is None
                      or c.expected_joules <= max_joules]
            cap_met = bool(within)
            if within:
                pool = within
                note = f"; cap {max_joules:g} J"
            else:
                pool = [min(cands, key=lambda c: _cost(c, self._rank))]
                note = f"; no action fits the {max_joules:g} J cap, cheapest taken"
        best_q = max(c.expected_quality for c in pool)
        if mode == "max-quality":
            top = [c for c in pool if c.expected_quality >= best_q - 1e-9]
            pick = min(top, key=lambda c: _cost(c, self._rank))
            why = f"max-quality: best expected quality {best_q:.3f}"
        elif mode == "min-energy":
            pick = min(pool, key=lambda c: (_cost(c, self._rank), -c.expected_quality))
            why = "min-energy: fewest expected joules"
        elif per_query_tolerance is not None:
            floor = best_q - per_query_tolerance
            ok = [c for c in pool if c.expected_quality >= floor - 1e-12]
            pick = min(ok, key=lambda c: (_cost(c, self._rank), -c.expected_quality))
            why = (f"quality target: fewest expected joules with quality >= {floor:.3f} "
                   f"({per_query_tolerance:.3f} below this request's best, {best_q:.3f})")
        else:
            floor = best_q * (1.0 - self.tolerance)
            ok = [c for c in pool if c.expected_quality >= floor - 1e-12]
            pick = min(ok, key=lambda c: (_cost(c, self._rank), -c.expected_quality))
            why = (f"balanced: fewest expected joules with quality >= {floor:.3f} "
                   f"({self.tolerance:.0%} below the best, {best_q:.3f})")
        return Choice(pick, why + note, tuple(cands), cap_met)

    def rank(self, tier: str) -> int:
        """A tier's place, cheapest first."""
        return self._rank[tier]

    def token_caps(self, c: Candidate, max_tokens: int | None) -> tuple[int, int | None]:
        """(max_tokens, thinking_budget) for the chosen action."""
        if c.spec.strategy == "cot":
            cap = min(max_tokens, self.caps.cot_max_tokens) if max_tokens \
                else self.caps.cot_max_tokens
            return cap, (self.caps.thinking_budget if c.spec.reasoning else None)
        cap = max_tokens or self.caps.direct_max_tokens
        return cap, (0 if c.spec.reasoning else None)
