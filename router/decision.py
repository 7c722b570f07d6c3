"""What the router decides for one request, and what it is asked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, field
from typing import Any, Literal

from router.record import record

Strategy = Literal["direct", "cot", "fewshot"]
Policy = Literal["min-energy", "balanced", "max-quality"]
POLICIES: tuple[Policy, ...] = ("min-energy", "balanced", "max-quality")


@record
class Query:
    """The plain facts of a request the router decides on."""

    text: str
    prompt_tokens: int
    max_tokens: int | None = None
    policy: Policy = "balanced"
    max_joules: float | None = None
    # backend -> requests it runs now, or the batch arrivals have been meeting
    # if larger (app.forward.traffic): what an action would run beside.
    concurrency: Mapping[str, int] = field(default_factory=dict)
    # Backends that cannot take a request now (no healthy replica, or saturated).
    unavailable: frozenset[str] = frozenset()
    # Keep this share of always-large quality over traffic like the reference
    # workload (`balanced`); None: the deployment's default.
    quality_target: float | None = None
    # The largest thinking budget the client allows (its reasoning_effort; 0:
    # no thinking, no CoT); None: the ladder's every rung.
    thinking_ceiling: int | None = None
    # max_tokens bounds thinking and answer together (max_completion_tokens);
    # otherwise a thinking budget comes on top of the answer's max_tokens.
    limit_includes_thinking: bool = False
    # The request has messages a strategy can rewrite (chat: an instruction,
    # worked examples, a thinking budget in the template); a raw prompt
    # (/v1/completions) is sent as it is: direct actions only.
    rewritable: bool = True

    def under(self, concurrency: Mapping[str, int], unavailable: frozenset[str]) -> Query:
        """This query under the load of the moment (`dataclasses.replace`
        walks every field by name: ~3x dearer, once per routed request)."""
        return Query(self.text, self.prompt_tokens, self.max_tokens, self.policy,
                     self.max_joules, concurrency, unavailable, self.quality_target,
                     self.thinking_ceiling, self.limit_includes_thinking, self.rewritable)


class Unroutable(Exception):
    """Every action's backend is unavailable."""


@record
class Decision:
    """One routing decision; `reason` says in words why it was taken."""

    tier: str
    backend: str
    strategy: Strategy
    max_tokens: int
    thinking_budget: int | None
    category: str
    category_probabilities: dict[str, float] = field(default_factory=dict)
    expected_joules: float | None = None
    expected_quality: float | None = None
    policy: Policy = "balanced"
    reason: str = ""
    routed: bool = True
    baseline_joules: float | None = None  # expected joules of the largest tier, direct
    # Set when the best action's backend was unavailable and the next best was
    # taken: says which action was wanted.
    degraded: str | None = None
    # With a joule cap: whether some action was expected to fit it (None: no cap).
    joule_cap_met: bool | None = None
    # P(the small tier's direct answer is worse than the large tier's); None
    # without a complexity model.
    complexity: float | None = None
    quality_target: float | None = None
    # Every action considered: tier, strategy, thinking_budget, expected_quality,
    # expected_joules, completion_tokens, thinking_tokens.
    candidates: tuple[dict[str, Any], ...] = ()

    def as_json(self) -> dict[str, Any]:
        return asdict(self)
