"""The policy: which action gives the quality this request needs for the fewest joules.

An action is a tier's backend with a strategy (direct or cot); on a reasoning
backend `cot` is thinking, one candidate per rung of the thinking-budget
ladder (router.thinking), `direct` is no thinking. For each, the
expected quality comes from the quality table weighted by the category
probabilities, the expected joules from the backend's operating curve at the
expected completion length, priced by what the backends run now
(router.pricing: alone, joining a batch, or beside another model). Modes:

- max-quality: the best expected quality (ties: fewer joules);
- balanced: the fewest joules among actions within `tolerance` (relative) of
  the best quality; with per-query qualities (a quality target), within an
  absolute tolerance of this request's best, taken in full where the best
  is at least `full_tolerance_from` and in proportion below it (a hard
  request, whose best answer is unlikely, is not given up for a few points),
  and never above the quality of the largest tier's answer as asked by name;
- min-energy: the fewest joules (ties: better quality).

`max_joules` removes actions expected to cost more; if none is left, the
cheapest is taken and the reason says the cap could not be met.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from router.curves import Curve
from router.decision import Policy as PolicyName
from router.fewshot import FewShot
from router.pricing import LoadPricing, Pricing, Site
from router.quality import ExpectedLengths, QualityTable, action
from router.record import record
from router.thinking import CLOSING_TOKENS, ThinkingModel, budget_share

COT_PROMPT_TOKENS = 32  # the step-by-step instruction added to the prompt
# A quality target's per-query tolerance applies in full to requests whose
# best action is expected to be this good or better, in proportion below:
# for a request whose best is 0.35, half of it. Chosen on the training
# prompts' easy/hard labels and the reference workload's expected savings
# (docs/routing.md, "Hard requests keep their best"); 0 takes it in full.
FULL_TOLERANCE_FROM = 0.7


@dataclass(frozen=True)
class ActionSpec:
    tier: str
    backend: str
    strategy: str  # "direct" | "cot" | "fewshot"
    reasoning: bool = False

    @property
    def key(self) -> str:
        return action(self.tier, self.strategy)


@record
class Candidate:
    spec: ActionSpec
    expected_quality: float
    expected_joules: float | None
    completion_tokens: int
    pricing: str = ""  # how its joules were priced (router.pricing): alone, shares, joins, beside
    # Reasoning backends: the thinking budget (0: no thinking) and the thinking
    # tokens expected under it (in completion_tokens); None: not a reasoning action.
    thinking_budget: int | None = None
    thinking_tokens: int = 0

    @property
    def label(self) -> str:
        """The action in words: `large:cot@1024` for a thinking budget."""
        b = self.thinking_budget
        return self.spec.key + (f"@{b}" if b and self.spec.strategy == "cot" else "")


@record
class Choice:
    chosen: Candidate
    reason: str
    candidates: tuple[Candidate, ...]
    cap_met: bool | None = None  # None: no joule cap asked


@dataclass(frozen=True)
class Caps:
    direct_max_tokens: int = 512
    cot_max_tokens: int = 1024


def baseline_of(cands: Sequence[Candidate], largest: str) -> Candidate | None:
    """The largest tier's answer when it is asked for by name: direct, or for a
    reasoning backend its unbounded thinking (the largest budget); None where
    the actions hold neither."""
    mine = [c for c in cands if c.spec.tier == largest]
    thinking = [c for c in mine if c.thinking_budget]
    if thinking:
        return max(thinking, key=lambda c: c.thinking_budget or 0)
    return next((c for c in mine if c.spec.strategy == "direct"), None)


def _cost(c: Candidate, rank: Mapping[str, int]) -> float:
    # Without a curve, fall back to the tier order (cheapest first in models.yaml).
    return c.expected_joules if c.expected_joules is not None else 1e12 * (1 + rank[c.spec.tier])


class Policy:
    def __init__(self, actions: list[ActionSpec], quality: QualityTable,
                 lengths: ExpectedLengths, curves: Mapping[str, Curve], tiers: list[str],
                 tolerance: float = 0.05, caps: Caps = Caps(),
                 sites: Mapping[str, Site] | None = None,
                 thinking: ThinkingModel | None = None,
                 few_shot: FewShot | None = None, load: LoadPricing | None = None,
                 full_tolerance_from: float = FULL_TOLERANCE_FROM) -> None:
        self.actions = actions
        self.full_tolerance_from = full_tolerance_from
        self.thinking = thinking or ThinkingModel()
        self.few_shot = few_shot or FewShot()
        self._shot_tokens = {c: self.few_shot.prompt_tokens(c) for c in self.few_shot.messages}
        self.quality = quality
        self.lengths = lengths
        self.curves = curves
        self.tolerance = tolerance
        self.caps = caps
        self._rank = {t: i for i, t in enumerate(tiers)}
        self._largest = tiers[-1]
        self.pricing = Pricing(sites or {}, {a.backend: self._rank[a.tier] for a in actions},
                               load)
        # What pricing an action needs that no request changes: its key, its token
        # cap, the prompt tokens its strategy adds, its backend's curve.
        self._plans = [(a, a.key, caps.cot_max_tokens if a.strategy == "cot"
                        else caps.direct_max_tokens,
                        COT_PROMPT_TOKENS if a.strategy == "cot" and not a.reasoning else 0,
                        curves.get(a.backend)) for a in actions]

    def candidates(self, probs: Mapping[str, float], prompt_tokens: int,
                   max_tokens: int | None, concurrency: Mapping[str, int],
                   quality: Mapping[str, float] | None = None, difficulty: float = 0.0,
                   ceiling: int | None = None, limit_includes_thinking: bool = False,
                   rewritable: bool = True) -> list[Candidate]:
        """Every action, priced. `quality`: this request's expected quality per
        action (the complexity model); without it, the category table's.
        `difficulty`: the request's logit above the median item (thinking
        lengths); `ceiling`: the client's largest thinking budget (0: none);
        `limit_includes_thinking`: `max_tokens` bounds thinking and answer
        together (the client's max_completion_tokens); `rewritable`: False for
        a raw prompt, which is sent as it is (direct actions only)."""
        def q_of(key: str) -> float:
            return quality[key] if quality is not None and key in quality \
                else self.quality.expected(probs, key)

        out = []
        for a, key, cap, extra, curve in self._plans:
            if a.strategy == "cot" and ceiling == 0:
                continue  # the client asked for no reasoning
            if not rewritable and a.strategy != "direct":
                continue  # nothing to put an instruction or examples into
            if a.reasoning:
                out += self._reasoning(a, key, curve, probs, prompt_tokens, max_tokens,
                                       concurrency, q_of, difficulty, ceiling,
                                       limit_includes_thinking)
                continue
            if a.strategy == "fewshot":
                out += self._few_shot(a, key, cap, curve, probs, prompt_tokens, max_tokens,
                                      concurrency, q_of)
                continue
            expected = self.lengths.expected(probs, key)
            limit = min(max_tokens, cap) if max_tokens else cap
            tokens = int(min(expected, limit))
            price = self.pricing.price(curve, a.backend, prompt_tokens + extra, tokens,
                                       concurrency) if curve else None
            out.append(Candidate(a, q_of(key), price.joules if price else None, tokens,
                                 price.note if price else "no curve"))
        return out

    def _few_shot(self, a: ActionSpec, key: str, cap: int, curve: Curve | None,
                  probs: Mapping[str, float], prompt_tokens: int, max_tokens: int | None,
                  concurrency: Mapping[str, int], q_of: Callable[[str], float]
                  ) -> list[Candidate]:
        """The examples' action, for a request whose likeliest category has
        examples: the direct answer's quality, a longer prompt, a shorter
        answer (router.fewshot)."""
        category = self.few_shot.offered(probs)
        if category is None:
            return []
        direct = action(a.tier, "direct")
        learned = self.lengths.column(key).get(category)
        expected = learned if learned is not None \
            else self.few_shot.answer_share * self.lengths.expected(probs, direct)
        tokens = int(min(expected, min(max_tokens, cap) if max_tokens else cap))
        prompt = prompt_tokens + self._shot_tokens[category]
        price = self.pricing.price(curve, a.backend, prompt, tokens, concurrency) \
            if curve else None
        return [Candidate(a, q_of(direct), price.joules if price else None, tokens,
                          price.note if price else "no curve")]

    def _reasoning(self, a: ActionSpec, key: str, curve: Curve | None,
                   probs: Mapping[str, float], prompt_tokens: int, max_tokens: int | None,
                   concurrency: Mapping[str, int], q_of: Callable[[str], float],
                   difficulty: float, ceiling: int | None, total: bool) -> list[Candidate]:
        """A reasoning backend's candidates: no thinking, or one per budget rung."""
        direct = action(a.tier, "direct")
        answer_cap = max_tokens or self.caps.direct_max_tokens
        answer = int(min(self.lengths.expected(probs, direct), answer_cap))
        q_direct = q_of(direct)
        if a.strategy == "direct":
            return [self._priced(a, curve, q_direct, prompt_tokens, answer, 0, 0,
                                 concurrency)]
        learned = self.lengths.column(action(a.tier, "think"))
        natural = self.thinking.natural(probs, learned, difficulty)
        gain = q_of(key) - q_direct
        out: list[Candidate] = []
        for rung in self.thinking.rungs(ceiling):
            budget = rung if rung is not None else self.thinking.max_thinking_tokens
            bounded, tokens = rung is not None, answer
            if total and max_tokens is not None:  # thinking and answer share the limit
                budget = min(budget, max_tokens - min(answer, max_tokens // 2))
                bounded, tokens = True, min(answer, max_tokens - budget)
                if budget < 32 or any(c.thinking_budget == budget for c in out):
                    continue
            limit = budget if bounded else None
            q = q_direct + gain * budget_share(limit, natural)
            out.append(self._priced(a, curve, q, prompt_tokens, tokens, budget,
                                    self.thinking.spent(limit, natural), concurrency))
        return out

    def _priced(self, a: ActionSpec, curve: Curve | None, q: float, prompt_tokens: int,
                answer: int, budget: int, thinking: int, concurrency: Mapping[str, int]
                ) -> Candidate:
        tokens = answer + thinking
        price = self.pricing.price(curve, a.backend, prompt_tokens, tokens, concurrency) \
            if curve else None
        return Candidate(a, q, price.joules if price else None, tokens,
                         price.note if price else "no curve", budget, thinking)

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
            tolerance = self.scaled(per_query_tolerance, best_q)
            floor = best_q - tolerance
            # A target is a share of always-large's quality: no request is asked
            # for more than always-large's own answer would give it.
            base = baseline_of(cands, self._largest)
            if base is not None and floor > base.expected_quality:
                why = (f"quality target: fewest expected joules with quality >= "
                       f"{base.expected_quality:.3f} (always-large's own, above {floor:.3f})")
                floor = base.expected_quality
            else:
                why = (f"quality target: fewest expected joules with quality >= {floor:.3f} "
                       f"({tolerance:.3f} below this request's best, {best_q:.3f})")
            ok = [c for c in pool if c.expected_quality >= floor - 1e-12]
            pick = min(ok, key=lambda c: (_cost(c, self._rank), -c.expected_quality))
        else:
            floor = best_q * (1.0 - self.tolerance)
            ok = [c for c in pool if c.expected_quality >= floor - 1e-12]
            pick = min(ok, key=lambda c: (_cost(c, self._rank), -c.expected_quality))
            why = (f"balanced: fewest expected joules with quality >= {floor:.3f} "
                   f"({self.tolerance:.0%} below the best, {best_q:.3f})")
        return Choice(pick, why + note, tuple(cands), cap_met)

    def scaled(self, tolerance: float, best_q: float) -> float:
        """A per-query tolerance for a request whose best action is expected
        at `best_q`: in full from `full_tolerance_from` up, in proportion below."""
        if best_q >= self.full_tolerance_from:
            return tolerance
        return tolerance * max(0.0, best_q) / self.full_tolerance_from

    def rank(self, tier: str) -> int:
        """A tier's place, cheapest first."""
        return self._rank[tier]

    def token_caps(self, c: Candidate, max_tokens: int | None,
                   limit_includes_thinking: bool = False) -> tuple[int, int | None]:
        """(max_tokens, thinking_budget) for the chosen action. A thinking
        budget comes on top of the answer's tokens unless the client's limit
        holds both (max_completion_tokens)."""
        if c.thinking_budget is not None:  # a reasoning backend
            answer = max_tokens or self.caps.direct_max_tokens
            if c.thinking_budget == 0 or (limit_includes_thinking and max_tokens):
                return answer, c.thinking_budget
            return c.thinking_budget + CLOSING_TOKENS + answer, c.thinking_budget
        if c.spec.strategy == "cot":
            cap = min(max_tokens, self.caps.cot_max_tokens) if max_tokens \
                else self.caps.cot_max_tokens
            return cap, None
        return max_tokens or self.caps.direct_max_tokens, None
