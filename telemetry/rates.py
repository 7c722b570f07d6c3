"""What a token costs at the margin, from a backend's operating curve.

The curve (router.curves) gives a request's gross joules as

    J(P, C, n) = b0 + b1 p + b2 c + b3 p c + b4 c / n + b5 p c / n + b6 p / n

(p, c: prompt and completion kilotokens; n: requests running together). Its
derivatives are the marginal cost rates the ledger splits a counter step by:

    a prompt token:              (b1 + b6 / n) / 1000
    an answer token, prompt P:   (b2 + b3 P/1000 + (b4 + b5 P/1000) / n) / 1000

so a request with a long prompt pays more per answer token (attention over a
longer context), and prefill is priced as the curve measured it, not by a
fixed weight. Without a curve: decode 1, prefill `prefill_weight` per token
(the older split). The curve also gives the standalone estimate J(P, C, 1):
what the request would have cost running alone. Pure arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenRates:
    coef: tuple[float, ...] | None = None  # the curve's 7 coefficients; None: token counts
    # Kept, not recomputed: a counter step hashes the rates of every window
    # doing work in it (the batch sizes), a tuple of 7 floats each time.
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(self.coef))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def from_curve(cls, coef: Sequence[float]) -> TokenRates:
        if len(coef) != 7:
            raise ValueError(f"a curve has 7 coefficients, got {len(coef)}")
        return cls(tuple(float(c) for c in coef))

    def prefill_rate(self, n: int, prefill_weight: float) -> float:
        if self.coef is None:
            return prefill_weight
        b = self.coef
        return (b[1] + b[6] / max(1, n)) / 1000.0

    def decode_rate(self, prompt_tokens: float, n: int) -> float:
        if self.coef is None:
            return 1.0
        b, p = self.coef, prompt_tokens / 1000.0
        return (b[2] + b[3] * p + (b[4] + b[5] * p) / max(1, n)) / 1000.0

    def standalone_joules(self, prompt_tokens: float, completion_tokens: float) -> float | None:
        """Gross joules of the request run alone (an estimate), or None without a curve."""
        if self.coef is None:
            return None
        b = self.coef
        p, c = prompt_tokens / 1000.0, completion_tokens / 1000.0
        return max(0.0, b[0] + (b[1] + b[6]) * p + (b[2] + b[4]) * c + (b[3] + b[5]) * p * c)


TOKEN_COUNTS = TokenRates()
