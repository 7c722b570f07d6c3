"""The router: classify the request, then let the policy pick the action."""

from __future__ import annotations

from router.classifier import Classifier
from router.decision import Decision, Query, Unroutable
from router.policy import Choice, Policy


class Router:
    def __init__(self, classifier: Classifier, policy: Policy, baseline_tier: str) -> None:
        self.classifier = classifier
        self.policy = policy
        self._baseline_tier = baseline_tier

    def decide(self, q: Query) -> Decision:
        probs = self.classifier.probabilities(q.text)
        category = max(probs, key=lambda k: probs[k])
        cands = self.policy.candidates(probs, q.prompt_tokens, q.max_tokens, q.concurrency)
        choice = self.policy.choose(cands, q.policy, q.max_joules)
        degraded = None
        if choice.chosen.spec.backend in q.unavailable:
            choice, degraded = self._next_best(choice, q)
        c = choice.chosen
        max_tokens, budget = self.policy.token_caps(c, q.max_tokens)
        baseline = next((x.expected_joules for x in cands
                         if x.spec.tier == self._baseline_tier and x.spec.strategy == "direct"),
                        None)
        joules = f"{c.expected_joules:.1f} J" if c.expected_joules is not None else "no curve"
        return Decision(
            tier=c.spec.tier, backend=c.spec.backend, strategy=c.spec.strategy,  # type: ignore[arg-type]
            max_tokens=max_tokens, thinking_budget=budget, category=category,
            category_probabilities={k: round(v, 4) for k, v in probs.items()},
            expected_joules=c.expected_joules, expected_quality=round(c.expected_quality, 4),
            policy=q.policy,
            reason=f"{category} ({probs[category]:.0%}); {c.spec.key} at {joules}, "
                   f"quality {c.expected_quality:.3f}; {choice.reason}",
            baseline_joules=baseline, degraded=degraded, joule_cap_met=choice.cap_met,
        )

    def _next_best(self, ideal: Choice, q: Query) -> tuple[Choice, str]:
        """The best action among available backends, when the best one is not."""
        left = [c for c in ideal.candidates if c.spec.backend not in q.unavailable]
        if not left:
            raise Unroutable(", ".join(sorted(q.unavailable)))
        wanted = ideal.chosen.spec
        choice = self.policy.choose(left, q.policy, q.max_joules)
        note = f"degraded: {wanted.key} wanted but {wanted.backend} is unavailable"
        return (Choice(choice.chosen, f"{choice.reason}; {note}", ideal.candidates,
                       choice.cap_met), wanted.key)
