"""Expected quality per category x action, and expected completion lengths.

Actions are "<tier>:<strategy>", e.g. "small:direct", "large:cot". The table
comes from models.yaml (defaults cited there) or from `joulegate eval`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


def action(tier: str, strategy: str) -> str:
    return f"{tier}:{strategy}"


@dataclass(frozen=True)
class QualityTable:
    scores: Mapping[str, Mapping[str, float]]  # category -> action -> expected accuracy
    default: float = 0.5

    def expected(self, probs: Mapping[str, float], act: str) -> float:
        total = 0.0
        for cat, p in probs.items():
            total += p * self.scores.get(cat, {}).get(act, self.default)
        return total

    def actions(self) -> set[str]:
        return {a for row in self.scores.values() for a in row}


DEFAULT_LENGTHS = {"direct": 200.0, "cot": 600.0}


@dataclass
class ExpectedLengths:
    """Completion tokens per (category, action), learned from traffic (EWMA)."""

    alpha: float = 0.05
    values: dict[str, dict[str, float]] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def expected(self, probs: Mapping[str, float], act: str) -> float:
        fallback = DEFAULT_LENGTHS.get(act.partition(":")[2], 300.0)
        values = self.values
        total = 0.0
        for c, p in probs.items():
            row = values.get(c)
            total += p * (fallback if row is None else row.get(act, fallback))
        return total

    def column(self, act: str) -> dict[str, float]:
        """category -> the learned value for `act`, where one has been learned."""
        return {c: row[act] for c, row in self.values.items() if act in row}

    def observe(self, category: str, act: str, completion_tokens: int) -> None:
        row = self.values.setdefault(category, {})
        n = self.counts.setdefault(category, {}).get(act, 0)
        old = row.get(act)
        # A plain mean until 1/alpha observations, then an exponential average.
        a = max(self.alpha, 1.0 / (n + 1))
        row[act] = float(completion_tokens) if old is None else old + a * (completion_tokens - old)
        self.counts[category][act] = n + 1

    def to_json(self) -> dict[str, object]:
        return {"alpha": self.alpha, "values": self.values, "counts": self.counts}

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> ExpectedLengths:
        values = d.get("values", {})
        counts = d.get("counts", {})
        alpha = d.get("alpha", 0.05)
        assert isinstance(values, dict) and isinstance(counts, dict)
        return cls(float(alpha) if isinstance(alpha, int | float) else 0.05,
                   {str(k): dict(v) for k, v in values.items()},
                   {str(k): dict(v) for k, v in counts.items()})
