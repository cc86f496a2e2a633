"""Our bf16 decode attention kernel (dspark_core/modeling/cpu_attention.py): the same attention as SDPA to bf16's
precision, where `attend` runs it, and SDPA in its place when it cannot build or is turned off."""

from __future__ import annotations

import ctypes

import pytest
import torch

from dspark_core.config import ASSETS
from dspark_core.modeling import cpu_attention
from dspark_core.modeling.checkpoint import load_model
from dspark_core.modeling.compiled import CompiledStep
from dspark_core.modeling.model import attend


def _case(b: int, nh: int, nkv: int, t: int, hd: int, lk: int, seed: int = 0):
    """q [B, nh, T, hd] (a transposed view, as the model passes it), keys / values read from a cache laid out
    [slots, positions, nkv, hd] (strided), per-row positions, their mask and prefix lengths."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, nh, hd, generator=g).to(torch.bfloat16).transpose(1, 2)
    kc, vc = (torch.randn(b, lk + 7, nkv, hd, generator=g).to(torch.bfloat16) for _ in range(2))
    keys, vals = kc[:, :lk].transpose(1, 2), vc[:, :lk].transpose(1, 2)
    pos = torch.randint(t - 1, lk - t + 1, (b, 1), generator=g) + torch.arange(t)  # [B, T]
    mask = (torch.arange(lk)[None, None, :] <= pos[:, :, None])[:, None]
    return q, keys, vals, mask, pos + 1


@pytest.fixture
def kernel():
    if not cpu_attention.use(True):
        pytest.skip(f"the kernel does not run on this machine: {cpu_attention.why}")
    return cpu_attention


@pytest.mark.parametrize("shape", [(1, 9, 3, 1, 64, 300), (8, 9, 3, 9, 64, 260), (3, 8, 8, 1, 128, 77),
                                   (2, 6, 2, 1, 32, 5), (2, 32, 8, 17, 128, 40), (2, 4, 2, 3, 256, 33),
                                   (1, 9, 3, 5, 64, 16)])
def test_the_kernel_is_attention_to_bf16_precision(kernel, shape):
    """Against fp32 attention: no further off than SDPA in bf16 on the same inputs (GQA and MHA, head dims 32 to
    256 (64 and 128 have copies of their own), rows attending different lengths, 1 to 17 tokens a row, key counts
    that are and are not multiples of the 16-key blocks)."""
    q, keys, vals, mask, lens = _case(*shape)
    ref = attend(q.float(), keys.float(), vals.float(), mask)
    got = torch.ops.dspark.cpu_attention(q, keys, vals, lens)
    sdpa = attend(q, keys, vals, mask)
    assert got.shape == ref.shape and got.dtype == torch.bfloat16
    assert (got.float() - ref).abs().max() <= 1.5 * (sdpa.float() - ref).abs().max() + 1e-3


@pytest.mark.parametrize("hd", [64, 128, 96])
def test_padding_queries_are_skipped_and_the_live_ones_unchanged(kernel, hd):
    """A ragged verify step's grid: rows verifying 1 to T tokens, the rest of each row padding (lens 0). The padding
    outputs are exactly 0 and every live query's output is bit-identical to the same query in a dense call (each
    query's sums run in the same order, whichever neighbours are live)."""
    q, keys, vals, mask, lens = _case(4, 9, 3, 9, hd, 120, seed=3)
    live = torch.arange(9)[None, :] < torch.tensor([[9], [1], [4], [2]])  # [B, T]
    dense = torch.ops.dspark.cpu_attention(q, keys, vals, lens)
    ragged = torch.ops.dspark.cpu_attention(q, keys, vals, lens * live)
    grid = live[:, None, :, None].expand_as(ragged)  # [B, nh, T, hd]
    assert torch.equal(ragged[grid], dense[grid])
    assert not ragged[~grid].any()


def test_the_serving_line_names_the_attention_each_model_runs(kernel):
    assert kernel.label(torch.device("cpu"), torch.bfloat16) == "our bf16 attention kernel"
    assert kernel.label(torch.device("cpu"), torch.float32) == "SDPA attention"


def test_attend_runs_it_for_bf16_steps_over_the_cache_only(kernel):
    for t in (1, 9):  # decode and a verify block
        q, keys, vals, mask, lens = _case(4, 6, 2, t, 32, 50)
        assert kernel.takes(q, keys) and torch.equal(attend(q, keys, vals, mask, lens),
                                                     torch.ops.dspark.cpu_attention(q, keys, vals, lens))
    assert not kernel.takes(q.float(), keys.float())  # fp32 stays on SDPA (eager and compiled agree exactly)
    assert torch.equal(attend(q, keys, vals, mask), attend(q, keys, vals, mask, None))  # no lengths: SDPA


def test_a_failed_build_or_the_switch_leaves_sdpa_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_attention, "_lib", None)
    monkeypatch.setattr(cpu_attention, "_ready", False)
    monkeypatch.setattr(cpu_attention, "_tried", False)
    monkeypatch.setattr(cpu_attention, "_enabled", True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a compiler that fails
    q, keys, vals, mask, lens = _case(2, 6, 2, 1, 32, 20)
    assert not cpu_attention.load() and "did not build" in cpu_attention.why
    assert cpu_attention.label(torch.device("cpu"), torch.bfloat16).startswith("SDPA attention (cpu_attention.c did")
    assert not cpu_attention.takes(q, keys)
    assert torch.equal(attend(q, keys, vals, mask, lens), attend(q, keys, vals, mask))
    assert not list(tmp_path.rglob("*.so"))  # nothing half-written left in the cache
    monkeypatch.setattr(cpu_attention, "_tried", False)
    monkeypatch.setattr(cpu_attention, "_enabled", False)
    assert not cpu_attention.load() and cpu_attention.why == "DSPARK_CPU_ATTENTION=sdpa"


def _tokens(b: int, t: int) -> torch.Tensor:
    return torch.randint(0, 4096, (b, t), generator=torch.Generator().manual_seed(1))


def _compiled_against_eager(step: torch.Tensor, n_new: list[int] | None, sizes: tuple[int, ...] | None = None):
    """The tiny bf16 target's step `step` [B, T] over 12-token prompts in slots 0..B-1, eager and through a compiled
    step: (eager out, compiled out, one (batch rows, grid queries, of them length 0) per kernel call)."""
    torch.manual_seed(0)
    model = load_model(ASSETS / "target", "cpu", "bf16")
    b = step.shape[0]
    eager, comp = model.new_cache(b, 64), model.new_cache(b, 64)
    prompts = torch.randint(0, model.arch.vocab_size, (b, 12))
    for cache in (eager, comp):
        model(prompts, cache, list(range(b)))
    want = model(step, eager, list(range(b)), n_new)
    calls = []
    real = cpu_attention._lib.dspark_attention_bf16

    def counted(*a):  # a[3]: lens [B, T]; a[5]: B; a[8]: T
        lens = torch.frombuffer((ctypes.c_int64 * (a[5] * a[8])).from_address(a[3]), dtype=torch.int64)
        calls.append((a[5], a[5] * a[8], int((lens == 0).sum())))
        return real(*a)

    model.compiled = CompiledStep(model, sizes=sizes) if sizes else CompiledStep(model)
    try:
        cpu_attention._lib.dspark_attention_bf16 = counted
        got = model(step, comp, list(range(b)), n_new)
    finally:
        model.compiled = None
        cpu_attention._lib.dspark_attention_bf16 = real
    return want, got, calls, model.arch.num_hidden_layers


def test_a_compiled_bf16_decode_step_runs_the_kernel_and_equals_eager(kernel):
    """The compiled step's graph calls the kernel (an opaque op) and gives the eager model's logits."""
    want, got, calls, layers = _compiled_against_eager(_tokens(2, 1), None, sizes=(1,))
    assert calls == [(2, 2, 0)] * layers
    assert torch.allclose(got.logits, want.logits, atol=5e-2, rtol=2e-2)  # bf16: a unit in the last place or two
    assert torch.equal(got.logits.argmax(-1), want.logits.argmax(-1))


def test_a_compiled_ragged_bf16_verify_skips_the_padding_and_equals_eager(kernel):
    """A packed verify step whose rows verify 3, 1 and 2 tokens (on a grid of 3 rows x 4: no engine sizes, so the
    tokens pad to a power of two): the graph hands the kernel every padding query as length 0, and its logits are
    the eager model's to a bf16 ulp or two."""
    n_new = [3, 1, 2]
    want, got, calls, layers = _compiled_against_eager(_tokens(3, 3), n_new)
    assert calls == [(3, 12, 12 - sum(n_new))] * layers
    for r, n in enumerate(n_new):
        assert torch.allclose(got.row_logits(r)[:n], want.row_logits(r)[:n], atol=5e-2, rtol=2e-2)
        assert torch.equal(got.row_logits(r)[:n].argmax(-1), want.row_logits(r)[:n].argmax(-1))
