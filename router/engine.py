"""The router: read the request once (features), classify its category, judge
its complexity, price every action, and let the policy pick one."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from router.classifier import Classifier
from router.complexity import ComplexityModel, complexity
from router.decision import Decision, Query, Unroutable
from router.policy import Candidate, Choice, Policy
from router.record import record

MAX_TARGETS_KEPT = 64  # quality targets whose tolerance is remembered


@dataclass(frozen=True)
class Targets:
    """Quality target -> per-query tolerance, calibrated offline (linear between)."""

    tolerance_by_target: Mapping[float, float] = field(default_factory=dict)
    default_target: float = 0.95
    _memo: dict[float, float] = field(default_factory=dict, compare=False, repr=False)

    def tolerance(self, target: float) -> float:
        """Remembered per target; a client may send any target in its header
        (x-joulegate-quality-target), so at most MAX_TARGETS_KEPT are kept."""
        known = self._memo.get(target)
        if known is None:
            if len(self._memo) >= MAX_TARGETS_KEPT:
                self._memo.clear()
            known = self._memo[target] = self._tolerance(target)
        return known

    def _tolerance(self, target: float) -> float:
        points = sorted(self.tolerance_by_target.items())
        if not points or target >= 1.0:
            return 0.0
        if target <= points[0][0]:
            return points[0][1]
        for (t0, v0), (t1, v1) in itertools.pairwise(points):
            if t0 <= target <= t1:
                return v0 + (v1 - v0) * (target - t0) / (t1 - t0)
        return points[-1][1] * max(0.0, (1.0 - target) / (1.0 - points[-1][0]))


@record
class Assessment:
    probabilities: Mapping[str, float]
    category: str
    complexity: float | None  # None without a complexity model
    candidates: list[Candidate]


class Router:
    def __init__(self, classifier: Classifier, policy: Policy, baseline_tier: str,
                 model: ComplexityModel | None = None, targets: Targets = Targets()) -> None:
        self.classifier = classifier
        self.policy = policy
        self._baseline_tier = baseline_tier
        self.model = model
        self.targets = targets
        # The cheapest tier and the largest: complexity compares their direct answers.
        self.tiers = (min({a.tier for a in policy.actions}, key=policy.rank), baseline_tier)
        self._keys = [a.key for a in policy.actions]
        self._direct = tuple(f"{t}:direct" for t in self.tiers)

    def assess(self, q: Query) -> Assessment:
        """Everything the policy needs: category, per-query quality, and every
        action priced."""
        feats = self.classifier.features(q.text)
        probs = self.classifier.probabilities_of(feats)
        quality = None
        cx = None
        difficulty = 0.0
        if self.model is not None:
            theta = self.model.theta(feats, q.text)
            difficulty = theta - self.model.pivot
            quality = self.model.qualities(theta, probs, self._keys)
            small, large = (quality.get(k) for k in self._direct)
            if small is not None and large is not None:
                cx = complexity(small, large)
        cands = self.policy.candidates(probs, q.prompt_tokens, q.max_tokens, q.concurrency,
                                       quality, difficulty, q.thinking_ceiling,
                                       q.limit_includes_thinking, q.rewritable)
        return Assessment(probs, max(probs, key=lambda k: probs[k]), cx, cands)

    def decide(self, q: Query, explain: bool = True) -> Decision:
        """The action for `q`. `explain`: with the reason in words, the rounded
        category probabilities and every candidate (for /v1/route and
        evaluations; a forwarded request reads none of them)."""
        a = self.assess(q)
        probs, category, cx, cands = a.probabilities, a.category, a.complexity, a.candidates
        target = tolerance = None
        if self.model is not None:
            target = q.quality_target or self.targets.default_target
            tolerance = self.targets.tolerance(target)
        choice = self.policy.choose(cands, q.policy, q.max_joules, tolerance)
        degraded = None
        if choice.chosen.spec.backend in q.unavailable:
            choice, degraded = self._next_best(choice, q, tolerance)
        c = choice.chosen
        max_tokens, budget = self.policy.token_caps(c, q.max_tokens, q.limit_includes_thinking)
        baseline = next((x.expected_joules for x in cands
                         if x.spec.tier == self._baseline_tier and x.spec.strategy == "direct"),
                        None)
        d = Decision(
            tier=c.spec.tier, backend=c.spec.backend, strategy=c.spec.strategy,  # type: ignore[arg-type]
            max_tokens=max_tokens, thinking_budget=budget, category=category,
            expected_joules=c.expected_joules, expected_quality=round(c.expected_quality, 4),
            policy=q.policy, baseline_joules=baseline, degraded=degraded,
            joule_cap_met=choice.cap_met, complexity=None if cx is None else round(cx, 4),
            quality_target=target if q.policy == "balanced" else None)
        return _explained(d, choice, probs, cx) if explain else d

    def _next_best(self, ideal: Choice, q: Query, tolerance: float | None
                   ) -> tuple[Choice, str]:
        """The best action among available backends, when the best one is not."""
        left = [c for c in ideal.candidates if c.spec.backend not in q.unavailable]
        if not left:
            raise Unroutable(", ".join(sorted(q.unavailable)))
        wanted = ideal.chosen.spec
        choice = self.policy.choose(left, q.policy, q.max_joules, tolerance)
        note = f"degraded: {wanted.key} wanted but {wanted.backend} is unavailable"
        return (Choice(choice.chosen, f"{choice.reason}; {note}", ideal.candidates,
                       choice.cap_met), wanted.key)


def _explained(d: Decision, choice: Choice, probs: Mapping[str, float],
               cx: float | None) -> Decision:
    """`d` with its reason in words, rounded probabilities and candidates."""
    c, cands = choice.chosen, list(choice.candidates)
    joules = f"{c.expected_joules:.1f} J" if c.expected_joules is not None else "no curve"
    judged = f"complexity {cx:.2f}; " if cx is not None else ""
    return replace(
        d, category_probabilities={k: round(v, 4) for k, v in probs.items()},
        reason=f"{d.category} ({probs[d.category]:.0%}); {judged}{c.label}{_thinks(c)} at {joules}"
               f" ({c.pricing}{_waking_note(c, cands)}), quality {c.expected_quality:.3f};"
               f" {choice.reason}",
        candidates=tuple(_describe(x) for x in cands))


def _thinks(c: Candidate) -> str:
    """What a reasoning action's budget means, in words."""
    if c.thinking_budget is None:
        return ""
    if c.thinking_budget == 0:
        return " (no thinking)"
    return f" (thinking ~{c.thinking_tokens} tokens under a {c.thinking_budget}-token budget)"


def _describe(c: Candidate) -> dict[str, object]:
    return {"tier": c.spec.tier, "backend": c.spec.backend, "strategy": c.spec.strategy,
            "thinking_budget": c.thinking_budget,
            "expected_quality": round(c.expected_quality, 4),
            "expected_joules": None if c.expected_joules is None else round(c.expected_joules, 3),
            "completion_tokens": c.completion_tokens, "thinking_tokens": c.thinking_tokens,
            "pricing": c.pricing}


def _waking_note(chosen: Candidate, cands: list[Candidate]) -> str:
    """When the chosen action joins a running batch and another backend would
    have to start beside it: say what waking that one was priced at."""
    if not chosen.pricing.startswith(("joins", "shares")):
        return ""
    beside = [x for x in cands if x.pricing.startswith("beside")
              and x.spec.backend != chosen.spec.backend and x.expected_joules is not None]
    if not beside:
        return ""
    w = min(beside, key=lambda x: x.expected_joules or 0.0)
    return (f"; cheaper than waking {w.spec.backend} beside it for {w.spec.key} at "
            f"{w.expected_joules:.1f} J")
