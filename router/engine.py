"""The router: classify the request, then let the policy pick the action."""

from __future__ import annotations

from router.classifier import Classifier
from router.decision import Decision, Query
from router.policy import Policy


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
            baseline_joules=baseline,
        )
