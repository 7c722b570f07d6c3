"""A mixed prompt workload from ../shared/data plus the project's own prompts.

Mix (fractions of n): GSM8K 20%, MMLU question stems 30% (random subjects),
Arena-Hard 20%, the project's own chat / writing / extraction / code prompts
30% (router/data/own_prompts.tsv, which are also training data for the
classifier: the workload measures energy, not classifier accuracy).
"""

from __future__ import annotations

import csv
import json
import os
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIX = {"gsm8k": 0.2, "mmlu": 0.3, "arena-hard": 0.2, "own": 0.3}


def mixed_prompts(n: int, data: Path | None = None, seed: int = 0) -> list[tuple[str, str]]:
    data = data or Path(os.environ.get("JOULEGATE_DATA", ROOT.parent / "shared" / "data"))
    rng = random.Random(seed)
    with (data / "gsm8k" / "train.jsonl").open() as f:
        gsm = [json.loads(x)["question"] for x in f]
    mmlu = []
    for path in sorted((data / "mmlu" / "test").glob("*_test.csv")):
        with path.open(newline="") as f:
            mmlu += [r[0] for r in csv.reader(f) if r]
    with (data / "arena-hard" / "v0.1-question.jsonl").open() as f:
        arena = [json.loads(x)["prompt"] for x in f]
    own = [line.split("\t", 1)[1] for line in
           (ROOT / "router" / "data" / "own_prompts.tsv").read_text().splitlines()
           if "\t" in line and line.split("\t", 1)[0] in ("chat", "writing", "extraction", "code")]
    pools = {"gsm8k": gsm, "mmlu": mmlu, "arena-hard": arena, "own": own}
    out = []
    for source, frac in MIX.items():
        k = round(n * frac)
        out += [(source, t) for t in rng.sample(pools[source], min(k, len(pools[source])))]
    rng.shuffle(out)
    return out[:n]
