"""Few-shot as an action: worked examples put before the request, for the
categories a deployment gives examples for (`routing.few_shot`).

Seed 003 reproduced (docs/benchmarks.md, bench/results/seed-cpu-gpu-shots.json):
three worked examples before a HumanEval problem cut SmolLM2-135M's answer
tokens to 0.29, 0.37 and 0.32 of zero-shot on three machines (this CPU, the
GPU host's CPU, the H200) and its energy by 38-72%, at the same or a better
pass@1. So, until traffic says otherwise for a category:

- the answer with examples is ANSWER_SHARE of the same tier's direct answer
  (the measured mean), then the length learned for `<tier>:fewshot`;
- its quality is the tier's direct quality (pass@1 did not drop in any of
  the three runs: an assumption for other models and categories, stated);
- its prompt is longer by the examples' tokens, which the curves price like
  any prompt.

Pure: examples in, numbers out. Reasoning backends get no few-shot action
(their thinking budget is the lever there).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from router.features import estimate_tokens

ANSWER_SHARE = 0.33  # mean of 0.29, 0.37, 0.32 (seed-cpu-gpu-shots.json)
PER_MESSAGE_TOKENS = 4  # a chat template's role markers around each message


@dataclass(frozen=True)
class FewShot:
    """Per category, the example messages (user, assistant, ...) and their tokens."""

    messages: Mapping[str, tuple[Mapping[str, str], ...]] = field(default_factory=dict)
    answer_share: float = ANSWER_SHARE

    @classmethod
    def of(cls, examples: Mapping[str, Sequence[tuple[str, str]]],
           answer_share: float = ANSWER_SHARE) -> FewShot:
        """From category -> [(question, answer), ...]."""
        return cls({cat: tuple(m for q, a in pairs for m in (
            {"role": "user", "content": q}, {"role": "assistant", "content": a}))
            for cat, pairs in examples.items() if pairs}, answer_share)

    def prompt_tokens(self, category: str) -> int:
        """The tokens the examples add to a prompt (estimated as the router
        estimates prompts)."""
        return sum(estimate_tokens(m["content"]) + PER_MESSAGE_TOKENS
                   for m in self.messages.get(category, ()))

    def offered(self, probs: Mapping[str, float]) -> str | None:
        """The request's likeliest category, where it has examples."""
        if not self.messages or not probs:
            return None
        top = max(probs, key=lambda c: probs[c])
        return top if top in self.messages else None


def with_examples(messages: Sequence[Mapping[str, object]],
                  examples: Sequence[Mapping[str, str]]) -> list[Mapping[str, object]]:
    """`messages` with the examples after its leading system messages."""
    head = 0
    while head < len(messages) and messages[head].get("role") in ("system", "developer"):
        head += 1
    return [*messages[:head], *examples, *messages[head:]]
