"""Tiny GGUF files written with the gguf package (llama.cpp's own writer), for the import's tests: a Llama or Qwen2 of
two layers and 32 hidden units (~35 KB), its matrices quantized (Q8_0 by default), with a byte-level BPE tokenizer
in the metadata that transformers' GGUF loader turns into a fast tokenizer (the 256 byte symbols, three merges, the
ChatML tokens marked as control) and a ChatML chat template. Random weights: they answer a prompt with nonsense,
which is all a check of the conversion asks."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he"]


def byte_symbols() -> list[str]:
    """GPT-2's byte-level alphabet: the printable bytes as themselves, the other 68 as the code points from 256 on
    (what transformers' `bytes_to_unicode` gives, without importing transformers)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return sorted([chr(b) for b in printable] + [chr(256 + i) for i in range(len(others))])


def write_tiny_gguf(
    path: Path,
    arch: str = "llama",
    quant: str = "Q8_0",
    *,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    ffn: int = 64,
    odd_tensor: tuple[str, str] | None = None,
) -> Path:
    """Writes the model to `path`. `quant` is the ggml type of its matrices (norms stay F32); `odd_tensor`
    (name, ggml type) stores that one tensor as raw bytes of another type instead (I8: one transformers cannot
    dequantize)."""
    import gguf
    from gguf import GGMLQuantizationType, GGUFWriter, TokenType
    from gguf.quants import quantize

    writer = GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    tokens = [*byte_symbols(), "Ġt", "he", "Ġthe", *SPECIAL_TOKENS]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "llama-bpe")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.NORMAL] * (len(tokens) - 3) + [TokenType.CONTROL] * 3)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(0)
    qtype = GGMLQuantizationType[quant]

    def tensor(name: str, shape: tuple[int, ...]) -> None:
        if odd_tensor and odd_tensor[0] == name:
            writer.add_tensor(name, np.zeros(shape, dtype=np.int8), raw_dtype=GGMLQuantizationType[odd_tensor[1]])
            return
        if len(shape) == 1:
            writer.add_tensor(name, np.ones(shape, np.float32))
            return
        values = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        if qtype == GGMLQuantizationType.F32:
            writer.add_tensor(name, values)
        else:
            writer.add_tensor(name, quantize(values, qtype), raw_dtype=qtype)

    head = hidden // heads
    tensor("token_embd.weight", (len(tokens), hidden))
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", (hidden,))
        tensor(f"blk.{i}.attn_q.weight", (hidden, hidden))
        tensor(f"blk.{i}.attn_k.weight", (kv_heads * head, hidden))
        tensor(f"blk.{i}.attn_v.weight", (kv_heads * head, hidden))
        if arch == "qwen2":
            for part, size in (("q", hidden), ("k", kv_heads * head), ("v", kv_heads * head)):
                tensor(f"blk.{i}.attn_{part}.bias", (size,))
        tensor(f"blk.{i}.attn_output.weight", (hidden, hidden))
        tensor(f"blk.{i}.ffn_norm.weight", (hidden,))
        tensor(f"blk.{i}.ffn_gate.weight", (ffn, hidden))
        tensor(f"blk.{i}.ffn_up.weight", (ffn, hidden))
        tensor(f"blk.{i}.ffn_down.weight", (hidden, ffn))
    tensor("output_norm.weight", (hidden,))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf.GGUFReader(str(path)).tensors  # what llama.cpp's reader makes of it
    return path
