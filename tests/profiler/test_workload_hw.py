"""Workload presets and JSONL files, entropy with a runnable model, CPU detection and microbenchmarks."""

from __future__ import annotations

import json
import statistics

import pytest

from profiler.catalog import workload_presets
from profiler.hardware import detect, microbenchmarks
from profiler.workload import CHARS_PER_TOKEN, file_profile, measure_entropy, preset_profile


@pytest.mark.parametrize("name", ["chat", "code", "math", "mixed"])
def test_presets_are_complete(name):
    w = preset_profile(name)
    assert w.domain == name and w.concurrency and w.slo and w.slo.tpot_ms
    assert w.prompt_len.p50 <= w.prompt_len.p99 and w.output_len.p50 <= w.output_len.p99
    assert workload_presets()[name]["source"]


def test_jsonl_file_statistics(tmp_path):
    reqs = [{"prompt": "x" * (40 * (i + 1)), "output_len": 10 * (i + 1), "domain": "code", "arrival_s": 0.5 * i}
            for i in range(20)]
    path = tmp_path / "reqs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in reqs) + "\n")
    w, notes = file_profile(str(path))
    assert w.domain == "code" and w.name == "reqs.jsonl"
    assert w.prompt_len.mean == pytest.approx(statistics.fmean(len(r["prompt"]) / CHARS_PER_TOKEN for r in reqs))
    assert w.output_len.mean == pytest.approx(statistics.fmean(r["output_len"] for r in reqs))
    assert w.output_len.p99 == max(r["output_len"] for r in reqs)
    assert w.request_rate == pytest.approx((len(reqs) - 1) / reqs[-1]["arrival_s"])
    assert any("characters per token" in n for n in notes)


def test_openai_chat_lines_are_workload_requests(tmp_path):
    """OpenAI's chat shape, bare or as a Batch API line, beside ours: messages become the prompt, max_tokens (or
    a trailing assistant answer's length) the output length; a bad message is one line naming the format."""
    from profiler.errors import ProfileError
    from profiler.workload import read_requests

    lines = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sort a list."}],
              "max_tokens": 64, "domain": "code"},
             {"custom_id": "r2", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                       "max_completion_tokens": 32}},
             {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "x" * 40}]},
             {"prompt": "ours", "output_len": 8}]
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    got = read_requests(path)
    assert got[0].prompt == "system: Be brief.\nuser: Sort a list." and got[0].output_len == 64
    assert got[0].domain == "code"
    assert got[1].prompt == "user: Hi" and got[1].output_len == 32
    assert got[2].prompt == "user: 2+2?" and got[2].output_len == 40 / CHARS_PER_TOKEN
    assert got[3].prompt == "ours" and got[3].output_len == 8
    path.write_text(json.dumps({"messages": [{"content": "no role"}]}) + "\n")
    with pytest.raises(ProfileError, match=r"chat.jsonl:1: messages.0.role: .*docs/workloads.md"):
        read_requests(path)


def test_mixed_domains_become_mixed(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"prompt": "a", "domain": "code"}\n{"prompt": "b", "domain": "math"}\n')
    w, notes = file_profile(str(path))
    assert w.domain == "mixed" and any("output lengths from" in n for n in notes)


def _tiny_model(folder):
    """A random 2-layer Qwen3 with a word-level tokenizer: a runnable stand-in for a target."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    words = "the a of to and is in it that for on with as was at by be this code math chat".split()
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64)
    Qwen3ForCausalLM(cfg).save_pretrained(folder)
    return len(vocab)


def test_entropy_with_a_runnable_model(tmp_path):
    import math

    vocab = _tiny_model(tmp_path)
    e = measure_entropy(tmp_path, ["the code is in the math", "a chat with it"])
    assert 0 < e.mean <= math.log(vocab) + 1e-6  # entropy of a distribution over `vocab` tokens
    assert 0 < e.p90 <= math.log(vocab) + 1e-6


def test_build_profile_reports_skipped_entropy_without_a_runnable_model(monkeypatch):
    import profiler.build as build

    monkeypatch.setattr(build, "runnable_model", lambda: None)
    p = build.build_profile("qwen3-0.6b", None, "chat", entropy=True)
    assert p.workload.entropy is None and any("entropy not measured" in n for n in p.notes)


def test_build_profile_measures_entropy_with_a_runnable_model(monkeypatch, tmp_path):
    import profiler.build as build

    _tiny_model(tmp_path)
    monkeypatch.setattr(build, "runnable_model", lambda: tmp_path)
    p = build.build_profile("qwen3-0.6b", None, "chat", entropy=True)
    assert p.workload.entropy is not None and p.workload.entropy.mean > 0


def test_cpu_detection_without_measurement():
    hw = detect(measure=False)
    assert hw.arch in ("cpu", "ampere", "ada", "hopper", "blackwell")
    assert hw.memory_gb and hw.memory_gb > 0 and hw.measured is None
    if hw.arch == "cpu":  # the capability that decides whether verification pays on this CPU
        import torch

        assert hw.cpu_capability == torch.backends.cpu.get_cpu_capability()


def test_microbenchmarks_report_positive_ceilings():
    steps: list[str] = []
    m = microbenchmarks("cpu", progress=steps.append, min_s=0.02)
    assert m.tflops_fp32 > 0 and m.tflops_bf16 > 0 and m.bandwidth_gbs > 0
    assert len(steps) == 4


def test_jsonl_lengths_use_the_model_tokenizer_when_the_model_is_a_folder(tmp_path):
    import profiler.build as build

    folder = tmp_path / "tiny"
    folder.mkdir()
    _tiny_model(folder)
    prompts = ["the code is in the math", "a chat"]
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    p = build.build_profile(str(folder), None, str(path))
    assert p.workload.prompt_len.mean == statistics.fmean(len(x.split()) for x in prompts)  # word-level ids
    assert not any("characters per token" in n for n in p.notes or [])


def test_entropy_is_measured_with_the_profiled_model_when_it_runs_here(monkeypatch, tmp_path):
    """A runnable model folder is its own entropy reference, not the tiny target."""
    import profiler.build as build

    folder = tmp_path / "mine"
    _tiny_model(folder)
    monkeypatch.setattr(build, "runnable_model", lambda: None)  # the tiny target would be the fallback
    p = build.build_profile(str(folder), None, "chat", entropy=True)
    assert p.workload.entropy is not None and p.workload.entropy.mean > 0
    assert any(f"entropy measured with {folder}" in n for n in p.notes)


def test_a_cpus_roofline_uses_the_dtype_the_engine_would_run():
    """Without AVX512-BF16 a CPU's bf16 matmuls are emulated (~1 GFLOP/s): the verdict's ridge and step time use
    its fp32 rate, not a ridge of 0 FLOP/B and a step of tens of seconds."""
    from profiler.derived import _ceilings
    from profiler.schema import HwProfile

    hw = HwProfile.model_validate({"name": "cpu", "arch": "cpu", "measured": {"bandwidth_gbs": 16.0,
                                                                             "tflops_bf16": 0.0009,
                                                                             "tflops_fp32": 0.067}})
    peak, bw = _ceilings(hw)
    assert peak == pytest.approx(0.067e12) and bw == pytest.approx(16e9)


def test_gpu_cpu_profiles_this_machines_memory_and_cores(monkeypatch, tmp_path, capsys):
    """`profile --gpu cpu` showed "memory None GiB" and "give --gpu" beside the --gpu it was given: the catalogue's
    cpu entry has no figures, so the machine's own memory and cores stand for it."""
    import cli
    from kb.db import open_db
    from kb.store import latest_profile

    monkeypatch.setenv("DSPARK_DB", f"sqlite:///{tmp_path / 'kb.sqlite'}")
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["profile", "--model", "tiny", "--gpu", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "None GiB" not in out and "give --gpu" not in out and "--gpu auto" in out
    db = open_db(None)
    try:
        hw = latest_profile(db)[1].hw
    finally:
        db.dispose()
    assert hw.name == "cpu" and hw.memory_gb and hw.memory_gb > 0 and hw.num_sms >= 1
    assert f"{hw.memory_gb:g} GiB" in out
