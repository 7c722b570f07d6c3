"""Write random-weight llama-architecture GGUF models for tests and energy work.

No weights can be downloaded where joulegate is developed, so test models are
written here with the `gguf` package. Random weights cost the same joules per
token as trained ones of the same shape; their text is noise.

    python workers/make_models.py --shape tiny-small --out models/tiny-small.gguf
    python workers/make_models.py --shape llama-1b   --out /tmp/llama-1b.gguf

Shapes: `tiny-small` and `tiny-large` are CPU test models (the large one does
many times the work per token); `llama-1b` and `llama-8b` have the shapes of
Llama-3.2-1B and Llama-3.1-8B for GPU energy measurements.
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


SHAPES: dict[str, Shape] = {
    "tiny-small": Shape(embd=64, layers=2, heads=4, kv_heads=2, ff=128, vocab=1024, ctx=4096),
    "tiny-large": Shape(embd=512, layers=8, heads=8, kv_heads=4, ff=1536, vocab=1024, ctx=4096),
    "llama-1b": Shape(embd=2048, layers=16, heads=32, kv_heads=8, ff=8192, vocab=128256, ctx=8192),
    "llama-8b": Shape(embd=4096, layers=32, heads=32, kv_heads=8, ff=14336, vocab=128256, ctx=8192),
}

# A ChatML-style template so llama-server's /v1/chat/completions formats prompts
# the same way for every test model.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def vocabulary(size: int) -> tuple[list[str], list[float], list[int]]:
    """SentencePiece-style vocabulary: specials, the 256 byte tokens, then pieces.

    Token types follow llama.cpp: 1 normal, 2 unknown, 3 control, 6 byte.
    Pieces are letters and words so ordinary text tokenizes into fewer tokens
    than bytes, like a real vocabulary would.
    """
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]
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
    scores = [0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(size - 259)]
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
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(f"joulegate-{shape_name}")
    w.add_context_length(s.ctx)
    w.add_embedding_length(s.embd)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.ff)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_rope_dimension_count(s.embd // s.heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(500000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens, scores, types = vocabulary(s.vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_chat_template(CHAT_TEMPLATE)

    pool = _RandomPool(seed)
    ones = np.ones(s.embd, dtype=np.float32)
    head_dim = s.embd // s.heads
    kv = s.kv_heads * head_dim
    w.add_tensor("token_embd.weight", pool.take((s.vocab, s.embd)))
    w.add_tensor("output_norm.weight", ones)
    for i in range(s.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", ones)
        w.add_tensor(p + "attn_q.weight", pool.take((s.embd, s.embd)))
        w.add_tensor(p + "attn_k.weight", pool.take((kv, s.embd)))
        w.add_tensor(p + "attn_v.weight", pool.take((kv, s.embd)))
        w.add_tensor(p + "attn_output.weight", pool.take((s.embd, s.embd)))
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
