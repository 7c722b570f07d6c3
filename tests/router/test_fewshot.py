"""Few-shot as an action: offered for categories with examples, priced with
the longer prompt and the shorter answer, put before the request."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.catalog import Backend, CatalogError, Replica, load_catalog
from app.forward.rewrite import rewrite_chat
from router.curves import Curve
from router.decision import Decision
from router.fewshot import ANSWER_SHARE, PER_MESSAGE_TOKENS, FewShot, with_examples
from router.policy import ActionSpec, Caps, Policy
from router.quality import ExpectedLengths, QualityTable

SHOTS = FewShot.of({"code": [("def f(x):\n    'Return x + 1.'", "```python\nreturn x + 1\n```"),
                             ("def g():", "```python\npass\n```")]})


def test_offered_only_for_the_likeliest_category_with_examples() -> None:
    assert SHOTS.offered({"code": 0.6, "chat": 0.4}) == "code"
    assert SHOTS.offered({"code": 0.4, "chat": 0.6}) is None
    assert FewShot().offered({"code": 1.0}) is None


def test_prompt_tokens_count_every_example_message() -> None:
    texts = ["def f(x):\n    'Return x + 1.'", "```python\nreturn x + 1\n```", "def g():",
             "```python\npass\n```"]
    assert SHOTS.prompt_tokens("code") == sum(max(1, len(t) // 4) + PER_MESSAGE_TOKENS
                                              for t in texts)
    assert SHOTS.prompt_tokens("chat") == 0


def test_examples_go_after_the_system_messages() -> None:
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "write f"}]
    out = with_examples(msgs, SHOTS.messages["code"])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "assistant",
                                        "user"]
    assert out[-1] == msgs[-1] and out[1]["content"].startswith("def f")
    assert with_examples([], SHOTS.messages["code"])[0]["role"] == "user"


def _policy(lengths: ExpectedLengths | None = None) -> Policy:
    # 1 J per prompt kilotoken... on P; 3 J per answer token on C (kilotokens)
    curve = Curve("s", "gpu0", "test", "m", "nvml", "today",
                  (0.0, 1000.0, 3000.0, 0.0, 0.0, 0.0, 0.0))
    actions = [ActionSpec("small", "s", "direct"), ActionSpec("small", "s", "fewshot")]
    quality = QualityTable({"code": {"small:direct": 0.4}, "chat": {"small:direct": 0.8}})
    return Policy(actions, quality, lengths or ExpectedLengths(), {"s": curve}, ["small"],
                  0.05, Caps(512, 1024), few_shot=SHOTS)


def test_the_action_is_priced_with_its_prompt_and_a_shorter_answer() -> None:
    p = _policy()
    direct, shots = p.candidates({"code": 1.0}, 100, None, {})
    assert shots.spec.strategy == "fewshot"
    assert shots.completion_tokens == int(ANSWER_SHARE * direct.completion_tokens)
    assert shots.expected_quality == direct.expected_quality == 0.4
    extra = SHOTS.prompt_tokens("code")
    assert shots.expected_joules == pytest.approx(
        (100 + extra) / 1000 * 1000 + shots.completion_tokens / 1000 * 3000)
    assert p.choose([direct, shots], "balanced", None).chosen is shots  # same quality, cheaper
    assert [c.spec.strategy for c in p.candidates({"chat": 1.0}, 100, None, {})] == ["direct"]


def test_a_learned_length_replaces_the_share() -> None:
    lengths = ExpectedLengths()
    for _ in range(3):
        lengths.observe("code", "small:fewshot", 150)
    direct, shots = _policy(lengths).candidates({"code": 1.0}, 100, None, {})
    assert shots.completion_tokens == 150 and direct.completion_tokens == 200


def test_rewrite_puts_the_examples_before_the_request() -> None:
    b = Backend(name="s", kind="llamacpp", tier="small", model="m",
                replicas=[Replica(url="http://127.0.0.1:1", device="d")])
    d = Decision(tier="small", backend="s", strategy="fewshot", max_tokens=66,
                 thinking_budget=None, category="code")
    body = {"model": "auto", "messages": [{"role": "user", "content": "write h"}]}
    out = rewrite_chat(body, d, b, 512, examples=SHOTS.messages["code"])
    assert len(out["messages"]) == 5 and out["messages"][-1]["content"] == "write h"
    assert body["messages"] == [{"role": "user", "content": "write h"}]  # untouched


def test_models_file_names_an_examples_file(tmp_path: Path) -> None:
    shipped = Path(__file__).resolve().parents[2] / "deploy" / "fewshot" / "code.yaml"
    (tmp_path / "code.yaml").write_text(shipped.read_text())
    models = tmp_path / "models.yaml"
    head = ("tiers: [small]\ndevices: [{name: d, source: estimate}]\n"
            "backends: [{name: s, kind: llamacpp, tier: small, model: m,"
            " replicas: [{url: 'http://127.0.0.1:1', device: d}]}]\n")
    models.write_text(head + "routing: {few_shot: {code: code.yaml}}\n")
    examples = load_catalog(models).routing.few_shot["code"]
    assert len(examples) == 3 and examples[0].user.startswith("Complete this function")
    models.write_text(head + "routing: {few_shot: {code: missing.yaml}}\n")
    with pytest.raises(CatalogError, match=r"routing\.few_shot\.code: cannot read"):
        load_catalog(models)
    (tmp_path / "bad.yaml").write_text("- {user: only a question}\n")
    models.write_text(head + "routing: {few_shot: {code: bad.yaml}}\n")
    with pytest.raises(CatalogError, match="assistant"):
        load_catalog(models)


def test_a_category_the_classifier_does_not_know_is_named_at_start(
        caplog: pytest.LogCaptureFixture) -> None:
    from app.catalog import parse_catalog
    from app.routing import LengthBook, build_router

    catalog = parse_catalog({
        "tiers": ["small"], "devices": [{"name": "d", "source": "estimate"}],
        "backends": [{"name": "s", "kind": "llamacpp", "tier": "small", "model": "m",
                      "replicas": [{"url": "http://127.0.0.1:1", "device": "d"}]}],
        "routing": {"few_shot": {"coding": [{"user": "q", "assistant": "a"}]}}})
    with caplog.at_level("WARNING", "joulegate.routing"):
        build_router(catalog, LengthBook(None))
    assert "coding not among the classifier's categories" in caplog.text
