"""The placeholder router: the simplest honest rule, until the real policy lands.

Rule: conversations whose text is longer than `long_prompt_chars`, or that ask
for code or math by keyword, go to the last (largest) tier; everything else to
the first (cheapest). No strategy changes, no energy model.
"""

from __future__ import annotations

import re

from router.decision import Decision, Query, Unroutable

_HARD = re.compile(r"\b(prove|derive|integral|equation|code|function|algorithm|debug)\b", re.I)


class PlaceholderRouter:
    def __init__(self, tiers: list[str], backends: dict[str, str], default_max_tokens: int,
                 long_prompt_chars: int = 800) -> None:
        self._tiers = tiers
        self._backends = backends
        self._default_max_tokens = default_max_tokens
        self._long = long_prompt_chars

    def decide(self, q: Query, explain: bool = True) -> Decision:
        hard = len(q.text) > self._long or bool(_HARD.search(q.text))
        tier = self._tiers[-1] if hard else self._tiers[0]
        why = "long or code/math keywords" if hard else "short, no code/math keywords"
        degraded = None
        if self._backends[tier] in q.unavailable:
            left = [t for t in self._tiers if self._backends[t] not in q.unavailable]
            if not left:
                raise Unroutable(", ".join(sorted(q.unavailable)))
            degraded, tier = tier, left[-1] if hard else left[0]
            why += f"; degraded: {degraded} unavailable"
        return Decision(
            tier=tier,
            backend=self._backends[tier],
            strategy="direct",
            max_tokens=q.max_tokens or self._default_max_tokens,
            thinking_budget=None,
            category="unknown",
            policy=q.policy,
            reason=f"placeholder rule: {why} -> {tier}",
            degraded=degraded,
        )
