"""The two reference workloads: prompts in the proportions of real chat
traffic, and the benchmark mix the project started with.

**chat-traffic** (the reference: quality targets are calibrated on it, the
H200 replay runs it first). Shares of request kinds from Chatterji et al.,
"How People Use ChatGPT" (NBER Working Paper 34255, 2025): the paper's
conversation topics as shares of a representative sample of consumer
messages, May 2024 - June 2025, taken from its figures as summarised in
secondary reports (the paper gives several snapshots; these are one, to
about a point); its multimedia (~6%) and unclassified (~5%) messages
dropped and the rest renormalised. Each kind draws its prompts from the
project's own labelled open prompts of that kind written for the workload
alone (router/data/traffic_prompts.tsv: never trained or tuned on, so the
share of trivial requests sent small and the savings are out of sample; the
quality targets are calibrated on their text, not their labels), hard
mathematical calculations also from GSM8K and hard programming also from
Arena-Hard's coding prompts. Within a kind, the share of easy requests is an assumption
(EASY_SHARE, [A]: no published per-kind difficulty split exists); over the
workload it declares TRIVIAL_SHARE of requests easy.

**benchmark-mix** (the second workload, kept): GSM8K 20%, MMLU question stems
30%, Arena-Hard 20%, the project's own chat / writing / extraction / code
prompts 30%.

**long-documents** (a probe, not a reference): easy requests about a long
pasted text (3,500 characters, ~900 tokens of a real tokenizer; Arena-Hard
prompts joined, standing in for a document), each followed by one of
DOCUMENT_ASKS. The router sends many of them small even beside a full batch
of the large model (their prompts are far cheaper on the small one), the
case docs/routing.md names as unmeasured.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIX = {"gsm8k": 0.2, "mmlu": 0.3, "arena-hard": 0.2, "own": 0.3}

# Percent of messages by fine conversation topic (NBER WP 34255); thanks fold into
# greetings and chitchat, logic puzzles into data analysis.
KIND_SHARE = {
    "tutoring": 10.2, "how_to": 8.5, "health": 5.7, "ideation": 3.9,  # practical guidance
    "edit_text": 10.6, "personal_writing": 8.0, "translation": 4.5,  # writing
    "summary": 3.6, "fiction": 1.4,
    "specific_info": 18.3, "products": 2.1, "recipes": 0.9,  # seeking information
    "programming": 4.2, "math_calc": 3.0, "data_analysis": 0.4,  # technical help
    "chitchat": 2.0, "reflection": 1.9, "role_play": 0.4,  # self-expression
}
# Share of easy requests within each kind [A].
EASY_SHARE = {
    "tutoring": 0.5, "how_to": 0.6, "health": 0.6, "ideation": 0.6, "edit_text": 0.6,
    "personal_writing": 0.6, "translation": 0.7, "summary": 0.4, "fiction": 0.5,
    "specific_info": 0.7, "products": 0.5, "recipes": 0.6, "programming": 0.4,
    "math_calc": 0.5, "data_analysis": 0.3, "chitchat": 0.9, "reflection": 0.6,
    "role_play": 0.5,
}
# Pools of the own prompts' kinds folded into a kind of KIND_SHARE.
FOLDED = {"thanks": "chitchat", "logic": "data_analysis", "extract": "summary"}
TRIVIAL_SHARE = sum(KIND_SHARE[k] * EASY_SHARE[k] for k in KIND_SHARE) / sum(KIND_SHARE.values())
CODE_WORDS = ("python", "javascript", "sql", "function", "code", "script", "rust", "c++",
              "java", "bash", "regex", "api", "class ")


def _data(data: Path | None) -> Path:
    return data or Path(os.environ.get("JOULEGATE_DATA", ROOT.parent / "shared" / "data"))


def _gsm8k(data: Path) -> list[str]:
    with (data / "gsm8k" / "train.jsonl").open() as f:
        return [json.loads(x)["question"] for x in f]


def _arena_hard(data: Path) -> list[str]:
    with (data / "arena-hard" / "v0.1-question.jsonl").open() as f:
        return [json.loads(x)["prompt"] for x in f]


def own_by_kind(path: Path | None = None) -> dict[tuple[str, str], list[str]]:
    """(kind, easy|hard) -> prompts, from a 4-column own prompts file (the
    workload's own, traffic_prompts.tsv, unless told)."""
    pools: dict[tuple[str, str], list[str]] = {}
    path = path or ROOT / "router" / "data" / "traffic_prompts.tsv"
    for line in path.read_text().splitlines():
        fields = line.split("\t")
        if line.startswith("#") or len(fields) != 4:
            continue
        kind = FOLDED.get(fields[2], fields[2])
        pools.setdefault((kind, fields[0]), []).append(fields[3])
    return pools


def chat_traffic(n: int, data: Path | None = None, seed: int = 0) -> list[tuple[str, str]]:
    """n (kind:easy|hard, prompt) pairs in the shares above, in random order.
    Stratified: each (kind, easy|hard) gets its share of n exactly (largest
    remainders), and its prompts are dealt from its shuffled pool, every one
    before any repeats, so a sample of a few hundred has the population's mix
    (quality targets calibrated on one hold on another)."""
    data = _data(data)
    rng = random.Random(seed)
    pools = own_by_kind()
    pools[("math_calc", "hard")] += _gsm8k(data)
    pools[("programming", "hard")] += [p for p in _arena_hard(data)
                                       if any(w in p.lower() for w in CODE_WORDS)]
    shares = {(k, label): KIND_SHARE[k] * (EASY_SHARE[k] if label == "easy" else 1 - EASY_SHARE[k])
              for k in KIND_SHARE for label in ("easy", "hard")}
    total = sum(shares.values())
    exact = {s: n * w / total for s, w in shares.items()}
    counts = {s: int(x) for s, x in exact.items()}
    for s in sorted(exact, key=lambda s: counts[s] - exact[s])[: n - sum(counts.values())]:
        counts[s] += 1
    out: list[tuple[str, str]] = []
    for (kind, label), count in counts.items():
        pool, picks = list(pools[(kind, label)]), list[str]()
        while len(picks) < count:
            rng.shuffle(pool)
            picks += pool[: count - len(picks)]
        out += [(f"{kind}:{label}", p) for p in picks]
    rng.shuffle(out)
    return out


def mixed_prompts(n: int, data: Path | None = None, seed: int = 0) -> list[tuple[str, str]]:
    """The benchmark mix: n (source, prompt) pairs."""
    data = _data(data)
    rng = random.Random(seed)
    mmlu = []
    for path in sorted((data / "mmlu" / "test").glob("*_test.csv")):
        with path.open(newline="") as f:
            mmlu += [r[0] for r in csv.reader(f) if r]
    own = [line.split("\t", 1)[1] for line in
           (ROOT / "router" / "data" / "own_prompts.tsv").read_text().splitlines()
           if "\t" in line and line.split("\t", 1)[0] in ("chat", "writing", "extraction", "code")]
    pools = {"gsm8k": _gsm8k(data), "mmlu": mmlu, "arena-hard": _arena_hard(data), "own": own}
    out = []
    for source, frac in MIX.items():
        k = round(n * frac)
        out += [(source, t) for t in rng.sample(pools[source], min(k, len(pools[source])))]
    rng.shuffle(out)
    return out[:n]


DOCUMENT_ASKS = ("Summarize the text above in two sentences.",
                 "List the main topics of the text above.",
                 "Give the text above a short title.",
                 "Translate the first sentence of the text above into French.")
DOCUMENT_CHARS = 3500  # the pasted text: within the test models' 4,096-token context


def long_documents(n: int, data: Path | None = None, seed: int = 0) -> list[tuple[str, str]]:
    """n ("document:<ask number>", prompt) pairs: a text of about
    DOCUMENT_CHARS characters joined from shuffled Arena-Hard prompts, then
    an easy request about it, the asks in turn."""
    pool = _arena_hard(_data(data))
    random.Random(seed).shuffle(pool)
    texts, cur = [], ""
    for p in itertools.cycle(pool):
        cur = f"{cur}\n\n{p}" if cur else p
        if len(cur) >= DOCUMENT_CHARS:
            texts.append(cur[:DOCUMENT_CHARS])
            cur = ""
            if len(texts) == n:
                break
    return [(f"document:{i % len(DOCUMENT_ASKS)}",
             f"{t}\n\n{DOCUMENT_ASKS[i % len(DOCUMENT_ASKS)]}") for i, t in enumerate(texts)]


WORKLOADS = {"chat-traffic": chat_traffic, "benchmark-mix": mixed_prompts,
             "long-documents": long_documents}
