"""Few-shot as an action on real workers, through the real `openai` client: a
code request gets the models file's examples before it, a greeting does not."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
import yaml

from app.catalog import parse_catalog
from tests.integration.conftest import RunningGateway, Workers, catalog_for, run_gateway
from workers.local import ROOT

CODE = ("Complete this Python function:\n\ndef add_all(values: list[int]) -> int:\n"
        '    """Return the sum of the values; 0 for an empty list."""\n')


@pytest.fixture(scope="module")
def shots_gateway(workers: Workers) -> Iterator[RunningGateway]:
    base = catalog_for([workers.small], [workers.large])
    examples = yaml.safe_load((ROOT / "deploy" / "fewshot" / "code.yaml").read_text())
    data = base.model_dump(mode="json")
    data["routing"]["few_shot"] = {"code": examples}  # validated as a models file's
    catalog = parse_catalog(data)
    with run_gateway(catalog) as gw:
        yield gw


def test_a_code_request_gets_the_examples(shots_gateway: RunningGateway) -> None:
    client = openai.OpenAI(base_url=shots_gateway.v1, api_key="none")
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": CODE}])
    assert raw.headers["x-joulegate-strategy"] == "fewshot"
    shot = raw.parse()
    plain = client.chat.completions.create(
        model="small", messages=[{"role": "user", "content": CODE}], max_tokens=16)
    assert shot.usage is not None and plain.usage is not None
    # Three examples of ~60 tokens each (the tiny models' tokenizer counts more).
    assert shot.usage.prompt_tokens > plain.usage.prompt_tokens + 150
    route = client.post("/route", cast_to=object, body={
        "model": "auto", "messages": [{"role": "user", "content": CODE}]})
    assert isinstance(route, dict) and route["strategy"] == "fewshot"
    assert any(c["strategy"] == "direct" and c["tier"] == route["tier"]
               for c in route["candidates"])


def test_no_examples_where_the_answer_is_capped_short(shots_gateway: RunningGateway) -> None:
    """A client's small max_tokens caps the direct answer as much as the
    examples would: their longer prompt no longer pays."""
    client = openai.OpenAI(base_url=shots_gateway.v1, api_key="none")
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": CODE}], max_tokens=16)
    assert raw.headers["x-joulegate-strategy"] == "direct"


def test_other_requests_get_none(shots_gateway: RunningGateway) -> None:
    client = openai.OpenAI(base_url=shots_gateway.v1, api_key="none")
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "Thanks, that was helpful :)"}],
        max_tokens=8)
    assert raw.headers["x-joulegate-strategy"] != "fewshot"


def test_a_raw_prompt_gets_no_examples(shots_gateway: RunningGateway) -> None:
    """/v1/completions has no messages to rewrite: direct actions only."""
    client = openai.OpenAI(base_url=shots_gateway.v1, api_key="none")
    raw = client.completions.with_raw_response.create(model="auto", prompt=CODE)
    assert raw.headers["x-joulegate-strategy"] == "direct"
