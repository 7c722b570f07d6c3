"""Write random-weight llama-architecture GGUF models for tests and energy work.

No weights can be downloaded where joulegate is developed, so test models are
written here with the `gguf` package. Random weights cost the same joules per
token as trained ones of the same shape; their text is noise.

    python workers/make_models.py --shape tiny-small --out models/tiny-small.gguf
    python workers/make_models.py --shape llama-1b   --out /tmp/llama-1b.gguf

Shapes: `tiny-small` and `tiny-large` are CPU test models (the large one does
many times the work per token); `llama-1b` and `llama-8b` have the shapes of
Llama-3.2-1B and Llama-3.1-8B for GPU energy measurements.

Thinking shapes carry a reasoning template (THINKING_TEMPLATE) and single
tokens for `<think>`, `</think>` and the ChatML tags, as real reasoning models
do: `tiny-think` for CPU tests, `qwen3-1.7b` and `qwen3-8b` for GPU work, with
Qwen3-1.7B's and Qwen3-8B's published dimensions (Qwen3 technical report,
arXiv 2505.09388, Table 1, and the models' config.json: 2048 wide, 28 layers,
16 query / 8 key-value heads of 128, 6144 feed-forward; 4096, 36 layers, 32 /
8 heads of 128, 12288; vocabulary 151,936) and its architecture (`qwen3`: an
RMS norm on each head's query and key). Random weights never close a think
span: the engine's budget (llama.cpp's `thinking_budget_tokens`) or the
workload decides where one ends.
"""

from __future__ import annotations

import argparse
import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Shape:
    embd: int
    layers: int
    heads: int
    kv_heads: int
    ff: int
    vocab: int
    ctx: int
    arch: str = "llama"
    head_dim: int | None = None  # None: embd // heads
    thinking: bool = False  # a reasoning template and think tokens


SHAPES: dict[str, Shape] = {
    "tiny-small": Shape(embd=64, layers=2, heads=4, kv_heads=2, ff=128, vocab=1024, ctx=4096),
    "tiny-large": Shape(embd=512, layers=8, heads=8, kv_heads=4, ff=1536, vocab=1024, ctx=4096),
    "llama-1b": Shape(embd=2048, layers=16, heads=32, kv_heads=8, ff=8192, vocab=128256, ctx=8192),
    "llama-8b": Shape(embd=4096, layers=32, heads=32, kv_heads=8, ff=14336, vocab=128256, ctx=8192),
    "tiny-think": Shape(embd=64, layers=2, heads=4, kv_heads=2, ff=128, vocab=1024, ctx=8192,
                        arch="qwen3", head_dim=16, thinking=True),
    "qwen3-1.7b": Shape(embd=2048, layers=28, heads=16, kv_heads=8, ff=6144, vocab=151936,
                        ctx=16384, arch="qwen3", head_dim=128, thinking=True),
    "qwen3-8b": Shape(embd=4096, layers=36, heads=32, kv_heads=8, ff=12288, vocab=151936,
                      ctx=16384, arch="qwen3", head_dim=128, thinking=True),
}

# A ChatML-style template so llama-server's /v1/chat/completions formats prompts
# the same way for every test model.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# A reasoning model's template, written here after the pattern of hybrid
# thinking models (Qwen3 and its successors, DeepSeek-R1 distills): the
# assistant's turn opens a think span (`<think>`) unless the request sets
# `chat_template_kwargs: {"enable_thinking": false}`, which renders an empty,
# closed span instead; earlier assistant turns keep only their answers. A span
# opened by the template is what llama.cpp's reasoning budget counts from.
THINKING_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|im_start|>assistant\n"
    "{% if m.get('reasoning_content') %}<think>\n{{ m['reasoning_content'] }}\n</think>\n\n"
    "{% endif %}{{ m['content'] }}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)
THINK_TOKENS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>")


def vocabulary(size: int, thinking: bool = False) -> tuple[list[str], list[float], list[int]]:
    """SentencePiece-style vocabulary: specials, the 256 byte tokens, then pieces.

    Token types follow llama.cpp: 1 normal, 2 unknown, 3 control, 6 byte.
    Pieces are letters and words so ordinary text tokenizes into fewer tokens
    than bytes, like a real vocabulary would.
    """
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]
    if thinking:  # user-defined tokens (type 4), matched whole in any text
        tokens += list(THINK_TOKENS)
        types += [4] * len(THINK_TOKENS)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    pieces: list[str] = []
    for ch in string.ascii_letters + string.digits + string.punctuation:
        pieces += [ch, "\u2581" + ch]
    words = (
        "the of and to in is that it for you was on are with as be this have from or "
        "what how why when which can energy model token joule answer question write code "
        "math explain please function number time data one two three"
    ).split()
    pieces += ["\u2581" + w for w in words]
    seen = set(tokens)
    for p in pieces:
        if p not in seen and len(tokens) < size:
            tokens.append(p)
            types.append(1)
            seen.add(p)
    n = len(tokens)
    while len(tokens) < size:
        tokens.append(f"\u2581tok{len(tokens) - n}")
        types.append(1)
    specials = 3 + (len(THINK_TOKENS) if thinking else 0)
    scores = [0.0] * (specials + 256) + [-float(i) for i in range(size - specials - 256)]
    return tokens, scores, types


class _RandomPool:
    """Random F16 values of magnitude ~1e-2, tiled from one pool.

    Drawing billions of fresh random numbers for the 8B shape takes minutes;
    tiling a 16M-value pool costs nothing and computes just the same.
    """

    def __init__(self, seed: int, pool_size: int = 1 << 24) -> None:
        rng = np.random.default_rng(seed)
        self._pool = (rng.standard_normal(pool_size, dtype=np.float32) * 0.02).astype(np.float16)
        self._offset = 0

    def take(self, shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(shape))
        start = self._offset % self._pool.size
        self._offset += 7919  # shift so tensors differ
        idx = np.arange(start, start + n) % self._pool.size if n < self._pool.size else None
        flat = self._pool[idx] if idx is not None else np.resize(self._pool, n)
        return flat.reshape(shape)


def write_model(shape_name: str, out: Path, seed: int = 0) -> Path:
    """Write one GGUF model of the named shape to `out` and return the path."""
    import gguf  # imported here: only model writing needs it

    s = SHAPES[shape_name]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    w = gguf.GGUFWriter(str(tmp), s.arch)
    head_dim = s.head_dim or s.embd // s.heads
    w.add_name(f"joulegate-{shape_name}")
    w.add_context_length(s.ctx)
    w.add_embedding_length(s.embd)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.ff)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    if s.arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_rope_freq_base(1000000.0)
    else:
        w.add_rope_dimension_count(head_dim)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(500000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens, scores, types = vocabulary(s.vocab, s.thinking)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_chat_template(THINKING_TEMPLATE if s.thinking else CHAT_TEMPLATE)

    pool = _RandomPool(seed)
    ones = np.ones(s.embd, dtype=np.float32)
    q = s.heads * head_dim
    kv = s.kv_heads * head_dim
    # The output projection is tied to the embedding (as in Qwen3-1.7B and
    # Llama-3.2-1B): the same weights are read per token either way.
    w.add_tensor("token_embd.weight", pool.take((s.vocab, s.embd)))
    w.add_tensor("output_norm.weight", ones)
    for i in range(s.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "attn_q.weight", pool.take((q, s.embd)))
        w.add_tensor(p + "attn_k.weight", pool.take((kv, s.embd)))
        w.add_tensor(p + "attn_v.weight", pool.take((kv, s.embd)))
        if s.arch == "qwen3":
            w.add_tensor(p + "attn_q_norm.weight", np.ones(head_dim, dtype=np.float32))
            w.add_tensor(p + "attn_k_norm.weight", np.ones(head_dim, dtype=np.float32))
        w.add_tensor(p + "attn_output.weight", pool.take((s.embd, q)))
        w.add_tensor(p + "ffn_norm.weight", ones)
        w.add_tensor(p + "ffn_gate.weight", pool.take((s.ff, s.embd)))
        w.add_tensor(p + "ffn_up.weight", pool.take((s.ff, s.embd)))
        w.add_tensor(p + "ffn_down.weight", pool.take((s.embd, s.ff)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.out.exists():
        print(args.out)
        return
    print(write_model(args.shape, args.out, args.seed))


if __name__ == "__main__":
    main()
