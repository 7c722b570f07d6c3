"""`joulegate eval`: measure the quality table on a live deployment.

Asks every action (tier x strategy) the questions of a local MMLU-format
folder (`<subject>_test.csv`: question, 4 choices, answer letter) and/or a
GSM8K-format file (`{"question", "answer": "... #### 42"}` lines) through the
gateway, scores the answers, and writes the table models.yaml takes under
`quality:` plus a report with the counts behind every cell.
"""

from __future__ import annotations

import csv
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.forward.rewrite import COT_INSTRUCTION
from app.tools.training import MMLU_CATEGORY

LETTERS = "ABCD"


@dataclass(frozen=True)
class Item:
    category: str
    prompt: str
    answer: str
    kind: str  # "mmlu" | "gsm8k"


def load_mmlu(folder: Path, per_subject: int, rng: random.Random) -> list[Item]:
    items = []
    for path in sorted(folder.glob("*_test.csv")):
        subject = path.name.removesuffix("_test.csv")
        cat = MMLU_CATEGORY.get(subject, "knowledge")
        with path.open(newline="") as f:
            rows = [r for r in csv.reader(f) if len(r) >= 6]
        for r in rng.sample(rows, min(per_subject, len(rows))):
            choices = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(r[1:5]))
            items.append(Item(cat, f"{r[0]}\n{choices}\nAnswer with the letter of the "
                                   f"correct choice.", r[5].strip().upper(), "mmlu"))
    return items


def load_gsm8k(path: Path, n: int, rng: random.Random) -> list[Item]:
    with path.open() as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [Item("math", r["question"], r["answer"].split("####")[-1].strip().replace(",", ""),
                 "gsm8k") for r in rng.sample(rows, min(n, len(rows)))]


def score(item: Item, text: str) -> bool:
    if item.kind == "mmlu":
        tail = text.split("Answer:")[-1]
        m = re.search(r"\b([ABCD])\b", tail)
        return bool(m) and m.group(1) == item.answer  # type: ignore[union-attr]
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text.replace(",", ""))
    try:
        return bool(numbers) and float(numbers[-1]) == float(item.answer)
    except ValueError:
        return False


def _ask(client: httpx.Client, base: str, tier: str, strategy: str, item: Item,
         max_tokens: int) -> str:
    msgs: list[dict[str, str]] = [{"role": "user", "content": item.prompt}]
    if strategy == "cot":
        msgs.insert(0, {"role": "system", "content": COT_INSTRUCTION})
    r = client.post(base + "/chat/completions", json={
        "model": tier, "messages": msgs, "temperature": 0,
        "max_tokens": max_tokens * (4 if strategy == "cot" else 1)})
    r.raise_for_status()
    content: Any = r.json()["choices"][0]["message"].get("content") or ""
    return str(content)


def evaluate(base_url: str, tiers: list[str], items: list[Item], max_tokens: int = 64,
             strategies: tuple[str, ...] = ("direct", "cot"), api_key: str | None = None,
             progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Every item asked of every tier and strategy (with `api_key` as the
    Bearer token where the gateway wants one); `progress` is told each
    tier:strategy's running count."""
    cells: dict[str, dict[str, list[bool]]] = {}
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(timeout=600, headers=headers) as client:
        for tier in tiers:
            for strategy in strategies:
                act = f"{tier}:{strategy}"
                for i, item in enumerate(items, 1):
                    ok = score(item, _ask(client, base_url, tier, strategy, item, max_tokens))
                    cells.setdefault(item.category, {}).setdefault(act, []).append(ok)
                    if i % 10 == 0 or i == len(items):
                        progress(f"{act}: {i}/{len(items)}")
    quality = {c: {a: round(sum(v) / len(v), 4) for a, v in row.items()}
               for c, row in cells.items()}
    counts = {c: {a: len(v) for a, v in row.items()} for c, row in cells.items()}
    return {"quality": quality, "counts": counts, "items": len(items)}


def merged(measured: dict[str, dict[str, float]], shipped: dict[str, dict[str, float]]
           ) -> dict[str, dict[str, float]]:
    """A whole quality table: what was measured, and the shipped values for
    every category and action that was not."""
    out = {c: dict(row) for c, row in shipped.items()}
    for category, row in measured.items():
        out.setdefault(category, {}).update(row)
    return out


def write(result: dict[str, Any], out: Path,
          shipped: dict[str, dict[str, float]] | None = None) -> None:
    """The measurements (JSON) and a quality table for a models file (YAML:
    measured cells over the `shipped` table, so that it is complete)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    table = merged(result["quality"], shipped or {})
    head = ("# joulegate eval: measured cells (see the JSON beside it for counts); the "
            "others are the models file's\n")
    out.with_suffix(".yaml").write_text(head + yaml.safe_dump({"quality": table},
                                                              sort_keys=True))
