"""Shared fixtures: the committed tiny models and small random models (no training in tests)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)  # tiny matmuls: a second thread only spins against the other jobs on shared CI cores

from dspark_core.config import ASSETS, EngineConfig  # noqa: E402
from dspark_core.modeling.arch import ArchConfig  # noqa: E402
from dspark_core.modeling.model import LeanModel  # noqa: E402


@pytest.fixture(scope="session")
def tiny_target() -> LeanModel:
    """The committed reference target (fp32 on CPU)."""
    from dspark_core.modeling.checkpoint import load_model

    return load_model(ASSETS / "target", "cpu", "fp32")


@pytest.fixture(scope="session")
def tiny_draft() -> LeanModel:
    """The committed reference draft model (fp32 on CPU)."""
    from dspark_core.modeling.checkpoint import load_model

    return load_model(ASSETS / "draft", "cpu", "fp32")


@pytest.fixture(scope="session")
def tiny_tokenizer():  # noqa: ANN201 - dspark_core.modeling.tokenizer.Tokenizer
    from dspark_core.modeling.tokenizer import Tokenizer

    return Tokenizer.load(ASSETS / "target")


def random_model(seed: int, vocab: int = 48, layers: int = 2) -> LeanModel:
    """A small random-weight Qwen3-architecture model (deterministic)."""
    torch.manual_seed(seed)
    arch = ArchConfig(model_type="qwen3", vocab_size=vocab, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      qk_norm=True)
    model = LeanModel(arch)
    with torch.no_grad():  # sharpen the logits so greedy runs are not all ties
        model.lm_head.weight.mul_(8.0)
    return model.eval()


def engine_config(block: int = 4, max_requests: int = 4, method: str = "ar_draft") -> EngineConfig:
    """A CPU engine config for tests."""
    cfg = EngineConfig(device="cpu")
    cfg.spec.block_size = block
    cfg.batch.max_requests = max_requests
    cfg.model.max_seq_len = 512
    cfg.drafter.method = method  # type: ignore[assignment]
    return cfg


def random_drafter(target: LeanModel, head: str = "markov", block: int = 4):  # noqa: ANN201 - DSparkDrafter
    """A small DSpark drafter with perturbed random weights on `target` (deterministic)."""
    from dspark_core.drafters.dspark import DraftConfig, DSparkDraftModel
    from dspark_core.drafters.dspark_runtime import DSparkDrafter

    torch.manual_seed(5)
    cfg = DraftConfig.for_target(target.arch, head=head, block_size=block, markov_rank=8, num_layers=1,
                                 intermediate_size=32, target_layers=[0, 1])
    m = DSparkDraftModel(cfg, target.embed, target.lm_head)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return DSparkDrafter(m.eval())


def sampled_second_token_tv(target: LeanModel, drafter, method: str, prompt: list[int], n: int):  # noqa: ANN001, ANN201
    """Sample 3 tokens after `prompt` n times through the engine with `drafter` (block 3, 64 requests at a time);
    (total variation between the 2nd token's empirical marginal and the target's exact one, the Generation)."""
    from dspark_core.engine import Engine
    from dspark_core.verification.sampling import SamplingParams

    vocab = target.arch.vocab_size
    with torch.no_grad():
        p1 = torch.softmax(target.forward_full(torch.tensor([prompt]))[0][0, -1], -1)
        p2 = torch.softmax(target.forward_full(torch.tensor([prompt + [t] for t in range(vocab)]))[0][:, -1], -1)
    want = p1 @ p2  # [V]: sum_t1 p(t1) p(t2 | t1)
    sp = SamplingParams(temperature=1.0, max_new_tokens=3, ignore_eos=True)
    eng = Engine(engine_config(block=3, max_requests=64, method=method), target=target, drafter=drafter)
    gen = eng.generate([prompt] * n, sp)
    counts = torch.bincount(torch.tensor([o.token_ids[1] for o in gen.outputs]), minlength=vocab).float() / n
    return 0.5 * float((counts - want).abs().sum()), gen
