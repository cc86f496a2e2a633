"""Fuzz target `gguf`: the GGUF reader behind `models fetch` (dspark_core/modeling/gguf_header.py + gguf_convert.py).

One input is written as a `.gguf` file and converted as far as a conversion goes without writing the folder:
`read_gguf_model` (the bounded header reader, typed metadata, the config it implies with config.json's bounds,
tensor shapes, the vocabulary), then `dequantized` (tensor data mapped and dequantised) and `tokenizer_files` (the
BPE tokenizer rebuilt). Each step may refuse with its one-line DSparkError; anything else escaping is a bug.
"""

from __future__ import annotations

from scratch import scratch_dir, write

from dspark_core.errors import DSparkError
from dspark_core.modeling.gguf_convert import dequantized, read_gguf_model, tokenizer_files

MAX_LEN = 32768


def _gguf(hidden: int, layers: int, quant: bool) -> bytes:
    """A tiny llama GGUF as llama.cpp writes one: metadata, a byte-level BPE vocabulary, F32 / F16 / Q8_0 tensors."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(0)
    special = ["<|endoftext|>", "<|im_start|>"]
    chars = [chr(c) for c in range(97, 107)] + ["Ġ"]
    tokens = special + chars + ["ab", "Ġa"]
    heads, kv, inter, vocab = 2, 1, hidden, len(tokens)
    path = scratch_dir() / f"seed-{hidden}-{layers}-{quant}.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hidden // heads)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(special) + [1] * (len(tokens) - len(special)))
    w.add_token_merges(["a b", "Ġ a"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    hd = hidden // heads
    emb = rng.standard_normal((vocab, hidden), dtype=np.float32)
    if quant:
        w.add_tensor("token_embd.weight", gguf.quants.quantize(emb, gguf.GGMLQuantizationType.Q8_0),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    else:
        w.add_tensor("token_embd.weight", emb.astype(np.float16))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    shapes = {"attn_norm": (hidden,), "ffn_norm": (hidden,), "attn_q": (heads * hd, hidden),
              "attn_k": (kv * hd, hidden), "attn_v": (kv * hd, hidden), "attn_output": (hidden, heads * hd),
              "ffn_gate": (inter, hidden), "ffn_up": (inter, hidden), "ffn_down": (hidden, inter)}
    for i in range(layers):
        for part, shape in shapes.items():
            t = rng.standard_normal(shape, dtype=np.float32)
            w.add_tensor(f"blk.{i}.{part}.weight", t.astype(np.float16) if quant else t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


SEEDS: list[bytes] = [_gguf(4, 1, False), _gguf(32, 1, True)]
DICTIONARY: list[bytes] = [b"GGUF", b"\x03\x00\x00\x00", b"\x08\x00\x00\x00", b"\x09\x00\x00\x00",
                           b"\xff\xff\xff\xff\xff\xff\xff\xff", b"llama.embedding_length", b"llama.block_count",
                           b"llama.attention.head_count", b"general.alignment", b"tokenizer.ggml.tokens",
                           b"tokenizer.ggml.merges", b"token_embd.weight", b"blk.0.attn_q.weight"]


def fuzz_one(data: bytes) -> None:
    """The GGUF conversion path on `data`, short of writing the folder; only its one-line user error is expected."""
    path = write("model.gguf", data)
    try:
        model = read_gguf_model(path)
        dequantized(model)
        tokenizer_files(model)
    except DSparkError:
        pass
