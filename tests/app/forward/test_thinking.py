"""The think-budget splice and body rewriting for reasoning backends."""

from __future__ import annotations

from app.forward.rewrite import COT_INSTRUCTION, rewrite_chat
from app.forward.thinking import close_span, continuation_body, vllm_think_body
from router.decision import Decision


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


def test_rewrite_sets_llamacpp_budget_for_reasoning_backends() -> None:
    body = {"model": "auto", "messages": [{"role": "user", "content": "prove it"}]}
    out = rewrite_chat(body, decision("cot", 256), "qwen3", True, "native")
    assert out["thinking_budget_tokens"] == 256 and out["model"] == "qwen3"
    assert out["messages"] == body["messages"]  # no prompting: the model thinks natively
    direct = rewrite_chat(body, decision("direct", 0), "qwen3", True, "native")
    assert direct["thinking_budget_tokens"] == 0


def test_rewrite_prompts_non_reasoning_models_for_cot() -> None:
    body = {"model": "auto", "messages": [{"role": "user", "content": "prove it"}]}
    out = rewrite_chat(body, decision("cot", None), "llama", False, "native")
    assert out["messages"][0] == {"role": "system", "content": COT_INSTRUCTION}
    assert out["max_tokens"] == 300
    assert "thinking_budget_tokens" not in out
