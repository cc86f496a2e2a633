"""Float32 greedy speculative decoding on the real pretrained target (SmolLM2-135M) is token-identical to plain
decoding: its committed DSpark drafters (every head x scheduler), its AR draft model and n-gram lookup.

Small sizes (two prompts, 12 new tokens) keep it to seconds; skipped when the model is absent, except under CI,
which fetches it (tests/dspark_core/test_smollm2.py)."""

from __future__ import annotations

import pytest

from dspark_core.config import EngineConfig, apply_params, drafter_path
from dspark_core.verification.sampling import SamplingParams

PROMPTS = ["import os\nimport sys\n\n\ndef main(argv):\n", "class Stack:\n    def push(self, item):\n"]
SP = SamplingParams(max_new_tokens=12)
SCHEDULERS = ("verify_all", "threshold", "prefix", "async_topk")


@pytest.fixture(scope="module")
def real(folder, tmp_path_factory):  # noqa: ANN201 - (target, tokenizer, base config)
    from dspark_core.modeling.checkpoint import load_model
    from dspark_core.modeling.tokenizer import Tokenizer
    from dspark_core.verification.verify_scheduler import profile_target_sps

    target = load_model(folder, "cpu", "fp32")
    # prefix and async_topk need an SPS table: profiled once here (as the engine would at start), not per test
    sps = tmp_path_factory.mktemp("sps") / "sps.json"
    profile_target_sps(target, 2 * (6 + 1), rows=2, affine=True).save(sps)
    base = EngineConfig.model_validate({"device": "cpu", "model": {"path": str(folder), "max_seq_len": 256},
                                        "spec": {"block_size": 6, "sps_path": str(sps)},
                                        "batch": {"max_requests": 2}})
    return target, Tokenizer.load(folder, target.arch.eos_ids), base


def _run(real, params: dict) -> list[list[int]]:
    from dspark_core.engine import Engine

    target, tok, base = real
    cfg = apply_params(base, params)
    return [o.token_ids for o in Engine(cfg, target=target, tokenizer=tok).generate(PROMPTS, SP).outputs]


@pytest.fixture(scope="module")
def plain(real) -> list[list[int]]:
    return _run(real, {"drafter.method": "plain"})


@pytest.mark.parametrize("head", ["none", "markov", "rnn"])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_dspark_fp32_greedy_is_lossless(real, plain, head: str, scheduler: str) -> None:
    params = {"drafter.method": "dspark", "spec.head": head, "spec.scheduler": scheduler}
    if drafter_path(apply_params(real[2], params)) is None:
        pytest.fail(f"no committed {head} drafter for smollm2-135m (dspark_core/assets/smollm2-135m/drafters)")
    assert _run(real, params) == plain


@pytest.mark.parametrize("method", ["ar_draft", "ngram"])
def test_peer_drafters_fp32_greedy_are_lossless(real, plain, method: str) -> None:
    assert _run(real, {"drafter.method": method}) == plain
