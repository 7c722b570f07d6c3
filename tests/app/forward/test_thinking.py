"""The think-budget splice and body rewriting for reasoning backends."""

from __future__ import annotations

from app.catalog import Backend, Replica
from app.forward.planner import within_ceiling, within_context
from app.forward.rewrite import COT_INSTRUCTION, rewrite_chat
from app.forward.thinking import close_span, continuation_body, vllm_think_body
from app.forward.usage import InlineThinking
from app.http.requests import ChatRequest, validate_chat
from router.decision import Decision
from router.thinking import CLOSING_TOKENS


def decision(strategy: str, budget: int | None) -> Decision:
    return Decision(tier="large", backend="b", strategy=strategy,  # type: ignore[arg-type]
                    max_tokens=300, thinking_budget=budget, category="math")


def test_close_span_closes_a_cut_off_thought() -> None:
    assert close_span("<think>\nfirst, 2+2 is") == "<think>\nfirst, 2+2 is\n</think>\n\n"
    assert close_span("first, 2+2 is") == "<think>\nfirst, 2+2 is\n</think>\n\n"


def test_close_span_drops_text_after_an_end_tag() -> None:
    assert close_span("<think>ok</think>The answer") == "<think>ok\n</think>\n\n"


def test_vllm_two_phase_bodies() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "2+2?"}], "stream": True,
            "stream_options": {"include_usage": True}}
    think = vllm_think_body(body, 128)
    assert think["max_tokens"] == 128 and think["stop"] == ["</think>"]
    assert think["stream"] is False and "stream_options" not in think
    cont = continuation_body(body, close_span("<think>2 plus 2"), 200)
    assert cont["messages"][-1] == {"role": "assistant",
                                    "content": "<think>2 plus 2\n</think>\n\n"}
    assert cont["continue_final_message"] is True and cont["add_generation_prompt"] is False
    assert body["messages"][-1]["role"] == "user"  # the original is untouched


def backend(kind: str = "llamacpp", reasoning: bool = True, thinking: str | None = None
            ) -> Backend:
    return Backend(name="b", kind=kind, tier="large", model="qwen3",  # type: ignore[arg-type]
                   replicas=[Replica(url="http://127.0.0.1:1", device="d")],
                   reasoning=reasoning, thinking=thinking)  # type: ignore[arg-type]


def routed(budget: int | None, max_tokens: int, strategy: str = "cot") -> Decision:
    return Decision(tier="large", backend="b", strategy=strategy,  # type: ignore[arg-type]
                    max_tokens=max_tokens, thinking_budget=budget, category="math")


BODY = {"model": "auto", "messages": [{"role": "user", "content": "prove it"}]}


def test_a_budget_goes_to_llamacpp_with_the_answer_on_top() -> None:
    out = rewrite_chat(BODY, routed(256, 256 + CLOSING_TOKENS + 300), backend(), 512, None,
                       False, "time is up")
    assert out["thinking_budget_tokens"] == 256 and out["model"] == "qwen3"
    assert out["reasoning_budget_message"] == "time is up"
    assert out["max_tokens"] == 256 + CLOSING_TOKENS + 300  # thinking, closing line, answer
    assert out["messages"] == BODY["messages"]  # no prompting: the model thinks natively
    asked = rewrite_chat(BODY, routed(256, 256 + CLOSING_TOKENS + 50), backend(), 512, 50)
    assert asked["max_tokens"] == 256 + CLOSING_TOKENS + 50  # the client's max_tokens: answer
    total = rewrite_chat(BODY, routed(256, 400), backend(), 512, 400, True)
    assert total["max_tokens"] == 400  # max_completion_tokens holds thinking and answer


def test_no_thinking_is_the_templates_switch_not_a_zero_budget() -> None:
    body = {**BODY, "chat_template_kwargs": {"foo": 1}, "thinking_budget_tokens": 99}
    out = rewrite_chat(body, routed(0, 300, "direct"), backend(), 512, None)
    assert out["chat_template_kwargs"] == {"foo": 1, "enable_thinking": False}
    assert "thinking_budget_tokens" not in out  # the client's budget is in the decision
    assert out["max_tokens"] == 300
    assert body["chat_template_kwargs"] == {"foo": 1}  # the client's body is untouched


def test_vllm_native_and_splice() -> None:
    native = rewrite_chat(BODY, routed(1024, 1200), backend("vllm", thinking="native"), 512)
    assert native["thinking_token_budget"] == 1024 and "thinking_budget_tokens" not in native
    splice = rewrite_chat(BODY, routed(1024, 1200), backend("vllm"), 512)
    assert "thinking_token_budget" not in splice and splice["max_tokens"] == 1200


def test_a_clients_ceiling_bounds_the_budget() -> None:
    d = routed(1024, 1024 + CLOSING_TOKENS + 200)
    low = within_ceiling(d, backend(), 256)
    assert (low.thinking_budget, low.max_tokens) == (256, 256 + CLOSING_TOKENS + 200)
    none = within_ceiling(d, backend(), 0)
    assert (none.thinking_budget, none.max_tokens) == (0, 200)
    assert within_ceiling(d, backend(reasoning=False), 0) is d
    forced = Decision(tier="large", backend="b", strategy="direct", max_tokens=0,
                      thinking_budget=None, category="forced", routed=False)
    assert within_ceiling(forced, backend(), 300).thinking_budget == 300
    assert within_ceiling(forced, backend(), None).thinking_budget is None


def test_rewrite_prompts_non_reasoning_models_for_cot() -> None:
    out = rewrite_chat(BODY, decision("cot", None), backend(reasoning=False))
    assert out["messages"][0] == {"role": "system", "content": COT_INSTRUCTION}
    assert out["max_tokens"] == 300
    assert "thinking_budget_tokens" not in out


def test_effort_maps_to_a_ceiling() -> None:
    def req(**kw: object) -> ChatRequest:
        return validate_chat({"model": "auto", "messages": [{"role": "user", "content": "x"}],
                              **kw})

    assert req(reasoning_effort="low").effort_ceiling == 256
    assert req(reasoning_effort="none").thinking_ceiling == 0
    assert req(reasoning_effort="high", thinking_budget_tokens=100).thinking_ceiling == 100
    assert req(reasoning_effort="high", thinking_budget_tokens=100).effort_ceiling == 4096
    assert req(chat_template_kwargs={"enable_thinking": False}).effort_ceiling == 0
    assert req(thinking_budget_tokens=-1).thinking_ceiling is None
    assert req(max_completion_tokens=50).limit_includes_thinking
    assert not req(max_tokens=50, max_completion_tokens=80).limit_includes_thinking


def _delta(text: str) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


def test_a_think_span_left_in_the_content_is_moved_out() -> None:
    inline = InlineThinking()
    chunks = [_delta(t) for t in ("<think>", "\nfirst, 2+2", " is 4</think>", "\n\nIt is", " 4.")]
    changed = [inline.feed(c) for c in chunks]
    deltas = [c["choices"][0]["delta"] for c in chunks]  # type: ignore[index]
    thought = "".join(d.get("reasoning_content") or "" for d in deltas)
    said = "".join(d.get("content") or "" for d in deltas)
    assert thought == "\nfirst, 2+2 is 4" and said == "It is 4."
    assert changed == [True, True, True, True, False]
    plain = InlineThinking()
    c = _delta("Hello there")
    assert not plain.feed(c) and c["choices"][0]["delta"]["content"] == "Hello there"  # type: ignore[index]
    again = [_delta("It is 4. "), _delta("<think>"), _delta("check"), _delta("</think>"),
             _delta("\n\nYes.")]  # a span opened again mid-answer
    assert [plain.feed(c) for c in again] == [False, True, True, True, True]
    deltas = [c["choices"][0]["delta"] for c in again]  # type: ignore[index]
    assert "".join(d.get("content") or "" for d in deltas) == "It is 4. Yes."
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "check"


def test_a_budget_leaves_room_in_the_context() -> None:
    b = backend().model_copy(update={"context_tokens": 2048})
    unbounded = routed(16384, 16384 + CLOSING_TOKENS + 200)
    fit = within_context(unbounded, b, 100)
    assert fit.thinking_budget == 2048 - 100 - 200 - CLOSING_TOKENS
    assert 100 + fit.max_tokens <= 2048
    forced = Decision(tier="large", backend="b", strategy="direct", max_tokens=50,
                      thinking_budget=10**6, category="forced", routed=False)
    assert within_context(forced, b, 100).thinking_budget == 2048 - 100 - 50 - CLOSING_TOKENS


def test_an_end_tag_at_the_start_of_the_answer_is_dropped() -> None:
    inline = InlineThinking()
    chunks = [_delta("</think>"), _delta("\n\n"), _delta("The answer")]
    assert [inline.feed(c) for c in chunks] == [True, True, False]
    said = "".join(c["choices"][0]["delta"]["content"] for c in chunks)  # type: ignore[index]
    assert said == "The answer"
