"""Thinking budgets: how long a reasoning model may think, and what a budget buys.

A reasoning backend's actions are its tier with no thinking (`direct`) and
with thinking under each budget of a small ladder (`cot`, budget B), plus an
unbounded rung (the model's natural length, capped at `max_thinking_tokens`).
Per query and action:

- **natural thinking length** L: how long the model would think if let,
  per category (seeded from published figures below, then learned from
  traffic like answer lengths), scaled by the query's difficulty: a logit
  above the median benchmark item lengthens it by exp(SLOPE x excess),
  clipped to [1/4, 4] x the category's figure. [A] The direction is
  documented (reasoning models think longer on harder items: DeepSeek-R1
  report, arXiv 2501.12948, Fig. 3; "Do NOT Think That Much for 2+3=?",
  arXiv 2412.21187, Table 1: QwQ-32B-Preview 772 tokens on GSM8K, 2,407 on
  MATH-500); the slope is an assumption.
- **thinking tokens spent**: min(B, L), plus the closing line the engine
  writes when a budget runs out.
- **quality**: the no-thinking quality plus the budget's share of the
  thinking gain, `budget_share(B, L)`:
  1 when B >= L; log-linear below, 1 + log2(B / L) / 2 (half the gain at half
  the length, none at a quarter), down to -1/2 (worse than not thinking).
  Evidence: the Qwen3 technical report (arXiv 2505.09388, Section 4.7 and
  Fig. 2): accuracy rises smoothly, roughly log-linearly, with the thinking
  budget; "Reasoning Models Can Be Effective Without Thinking" (arXiv
  2504.09858): at a 700-token budget, thinking cut off scored 28.9 and no
  thinking 51.3 (a cut-off thought can be worse than none); ThinkBrake
  (an oracle stop keeps accuracy with 72% fewer thinking tokens) and
  AdaptThink (-53% length, +2.4% accuracy): thinking to the natural end is
  not needed on easy items. The curve's constants are assumptions [A].

Pure arithmetic; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

LADDER_TOKENS: tuple[int, ...] = (256, 1024, 4096)
MAX_THINKING_TOKENS = 16384  # the unbounded rung's cap
CLOSING_TOKENS = 24  # the line the engine writes when a budget runs out

# A client's `reasoning_effort` (OpenAI's field): the largest budget it allows;
# 0: no thinking. None of the ladder is above `high`'s unless the client
# leaves the field out.
EFFORT_CEILING: dict[str, int] = {"none": 0, "minimal": 0, "low": 256, "medium": 1024,
                                  "high": 4096}

# Natural thinking tokens per category for a hybrid thinking model thinking to
# its own end (median request). Sources: math, "Do NOT Think That Much for
# 2+3=?" (arXiv 2412.21187, Table 1: QwQ-32B-Preview, GSM8K 772, MATH-500
# 2,407; joulegate's math is GSM8K-like word problems and calculation, so
# ~1,000); code: [A] 1,500 (LiveCodeBench-style tasks run thousands; everyday
# programming questions fewer); science and reasoning [A] 900 (GPQA-style
# items run longer, MMLU-style shorter); knowledge and social [A] 500; writing
# [A] 600 (planning a text); extraction [A] 400; chat [A] 250 (hybrid models
# think a few hundred tokens even on a greeting: the overthinking these papers
# describe).
THINKING_TOKENS: dict[str, float] = {
    "math": 1000.0, "code": 1500.0, "science": 900.0, "reasoning": 900.0,
    "knowledge": 500.0, "social": 500.0, "writing": 600.0, "extraction": 400.0,
    "chat": 250.0,
}
DEFAULT_THINKING_TOKENS = 600.0  # a category without a figure [A]
SLOPE = 0.5  # natural length x exp(SLOPE x difficulty above the median item) [A]
FLOOR = -0.5  # the worst a cut-off thought does, as a share of the gain


def budget_share(budget: float | None, natural: float) -> float:
    """The share of thinking's gain a budget keeps (None: unbounded)."""
    if budget is None or natural <= 0 or budget >= natural:
        return 1.0
    if budget <= 0:
        return 0.0
    return max(FLOOR, 1.0 + math.log2(budget / natural) / 2.0)


@dataclass(frozen=True)
class ThinkingModel:
    """Budgets offered and natural lengths expected."""

    budgets: tuple[int, ...] = LADDER_TOKENS
    max_thinking_tokens: int = MAX_THINKING_TOKENS
    tokens: Mapping[str, float] = field(default_factory=lambda: dict(THINKING_TOKENS))
    slope: float = SLOPE

    def rungs(self, ceiling: int | None) -> list[int | None]:
        """The budgets an action may take under a client's ceiling (None: no
        ceiling, the unbounded rung included)."""
        if ceiling is None:
            return [*self.budgets, None]
        return [b for b in self.budgets if b <= ceiling]

    def natural(self, probs: Mapping[str, float], learned: Mapping[str, float],
                difficulty: float) -> float:
        """Expected natural thinking tokens: per category (`learned` from
        traffic where it has been, the seed otherwise), weighted by the
        category probabilities, scaled by the difficulty above the median
        item (a logit; 0 without a complexity model)."""
        base = sum(p * learned.get(c, self.tokens.get(c, DEFAULT_THINKING_TOKENS))
                   for c, p in probs.items())
        scale = min(4.0, max(0.25, math.exp(self.slope * difficulty)))
        return min(float(self.max_thinking_tokens), base * scale)

    def spent(self, budget: int | None, natural: float) -> int:
        """Thinking tokens expected under a budget (with the closing line when
        the budget runs out)."""
        if budget is None or budget >= natural:
            return int(min(natural, self.max_thinking_tokens))
        return budget + CLOSING_TOKENS
