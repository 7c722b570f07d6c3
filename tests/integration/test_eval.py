"""`joulegate eval` against the real tiny workers: the code path is real, the
numbers are noise (random weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from app.cli import main
from app.tools.evaluate import Item, score
from tests.integration.conftest import RunningGateway

pytestmark = pytest.mark.integration


def test_scoring() -> None:
    mc = Item("science", "q", "B", "mmlu")
    assert score(mc, "Let me think. Answer: B") and not score(mc, "Answer: C")
    gsm = Item("math", "q", "1200", "gsm8k")
    assert score(gsm, "so the total is 1,200") and not score(gsm, "it is 12")


def test_eval_writes_a_quality_table(gateway: RunningGateway, tmp_path: Path) -> None:
    mmlu = tmp_path / "mmlu"
    mmlu.mkdir()
    (mmlu / "astronomy_test.csv").write_text(
        "What orbits the Earth?,The Moon,Mars,The Sun,Venus,A\n"
        "Which is a planet?,Sirius,Jupiter,Vega,Rigel,B\n")
    gsm = tmp_path / "gsm.jsonl"
    gsm.write_text(json.dumps({"question": "2+2?", "answer": "two and two #### 4"}) + "\n")
    out = tmp_path / "eval.json"
    rc = main(["eval", "--url", gateway.v1, "--mmlu", str(mmlu), "--gsm8k", str(gsm),
               "--max-tokens", "4", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["counts"]["science"]["small:direct"] == 2
    assert result["counts"]["math"]["large:cot"] == 1
    table = yaml.safe_load(out.with_suffix(".yaml").read_text())["quality"]
    assert {"science", "math", "chat"} <= set(table)  # measured over the shipped table
    assert all(0 <= v <= 1 for row in table.values() for v in row.values())
