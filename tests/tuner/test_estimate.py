"""`python cli.py estimate`: one deployment of one method at one load on the tuner's simulator, and its speedup
over the same deployment without speculation (tuner/estimate.py)."""

from __future__ import annotations

import json

import pytest

import cli
from tuner.errors import TunerError
from tuner.estimate import Case, estimate

KEYS = {"throughput", "tpot_ms", "ttft_ms", "tau", "speedup"}


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = cli.main(["estimate", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("method", ["dspark", "dflash", "eagle3", "draft_model", "ngram", "suffix"])
def test_every_method_runs_on_qwen3_8b_h100(method: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _cli(capsys, "--model", "qwen3-8b", "--gpu", "h100", "--concurrency", "4", "--method", method,
                        "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert KEYS <= r.keys() and r["none"]["method"] == "none"
    assert r["speedup"] == pytest.approx(r["throughput"] / r["none"]["throughput"], rel=1e-3)
    assert 1.0 < r["tau"] <= r["steps"] + 1 and r["tpot_ms"] > 0 and r["ttft_ms"] > 0


def test_mtp_runs_where_the_model_ships_modules_and_is_refused_where_not(capsys: pytest.CaptureFixture[str]) -> None:
    r = estimate(Case(model="deepseek-v3", gpu="mi300x", gpus=8, concurrency=4, method="mtp", steps=2))
    assert r["steps"] == 2 and r["throughput"] > 0 and "roofline" in r["cost_source"]
    rc, out, err = _cli(capsys, "--model", "llama-3.1-8b", "--gpu", "h100", "--method", "mtp")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "no MTP modules" in err


def test_speedup_of_mtp_on_deepseek_v3_falls_with_load() -> None:
    """SGLang's DeepSeek-V3 doc measures MTP on 8 x H200 at 1.8x at batch 1 and 1.5x at batch 32, and SGLang runs
    at most 48 requests when speculating: the speedup at 32 lies below batch 1's and at 64 below both (it never
    rises towards free verification on a big MoE batch)."""
    s = [estimate(Case(model="deepseek-v3", gpu="h200", gpus=8, dtype="fp8", concurrency=c, method="mtp", steps=3,
                       tau=2.8, isl=256, osl=256))["speedup"] for c in (1, 32, 64)]
    assert s[0] > s[1] > s[2] and s[0] > 1.3 and s[2] < 1.45


def test_a_draft_model_is_the_published_pairing_or_named() -> None:
    r = estimate(Case(model="qwen3-8b", gpu="h100", concurrency=2, method="draft_model", steps=3))
    assert "Qwen3-0.6B" in r["draft_model"]
    r = estimate(Case(model="deepseek-v3", gpu="h200", gpus=8, dtype="fp8", concurrency=2, method="draft_model",
                      steps=3))
    assert "what-if" in r["draft_model"]


@pytest.mark.parametrize(("args", "words"), [
    (["--method", "medusa"], "--method"),
    (["--method", "eagle3", "--steps", "99"], "--steps"),
    (["--method", "none", "--steps", "3"], "drafts nothing"),
    (["--method", "eagle3", "--steps", "3", "--tau", "5"], "--tau"),
    (["--method", "ngram", "--topk", "4"], "--topk"),
    (["--method", "eagle3", "--concurrency", "0"], "--concurrency"),
    (["--method", "eagle3", "--gpus", "3", "--tp", "2"], "multiple"),
    (["--method", "eagle3", "--model", "no-such-model"], "no-such-model"),
    (["--method", "eagle3", "--gpu", "tpu9"], "tpu9"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = {"--model": "qwen3-8b", "--gpu": "h100"}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    rc, out, err = _cli(capsys, *[x for kv in base.items() for x in kv])
    assert rc == 2 and out == "" and err.count("\n") == 1 and words in err


def test_check_refuses_a_tree_on_a_chain_method() -> None:
    with pytest.raises(TunerError, match="draft-tokens"):
        estimate(Case(model="qwen3-8b", gpu="h100", method="ngram", draft_tokens=8))
