"""The bench and generate commands end to end on the committed tiny models (short runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cli
from dspark_core.errors import DSparkError


def write_prompts(path: Path) -> Path:
    rows = [{"prompt": "def add(a, b):\n"}, {"prompt": "import os\nimport sys\n"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bench_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = write_prompts(tmp_path / "p.jsonl")
    rc = cli.main(["bench", "--prompts", str(prompts), "--max-new-tokens", "12", "--repeats", "1",
                   "--methods", "plain,hf_assisted,hf_prompt_lookup,ar_draft,ngram", "--block-size", "4", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompts"] == 2 and out["max_new_tokens"] == 12
    rows = {m["name"]: m for m in out["methods"]}
    assert list(rows) == ["plain", "hf_assisted", "hf_prompt_lookup", "ar_draft", "ngram"]
    assert rows["plain"]["speedup"] == 1.0 and rows["plain"]["tau"] == 1.0
    assert rows["ar_draft"]["lossless"] is True and rows["ngram"]["lossless"] is True
    assert rows["ar_draft"]["tau"] >= 1.0 and 1 <= len(rows["ar_draft"]["position_acceptance"]) <= 4
    assert all(m["tokens_per_s"] > 0 for m in out["methods"])
    assert rows["plain"]["full_batch_tokens_per_s"] > 0 and rows["hf_assisted"]["full_batch_tokens_per_s"] is None
    for name in ("plain", "ar_draft", "ngram"):  # where an engine method's seconds went; one request: no mixing
        split = rows[name]["time_split"]
        assert set(split) == {"prefill_s", "mixed_rounds_s", "full_rounds_s", "other_rounds_s"}
        assert split["mixed_rounds_s"] == 0 and split["full_rounds_s"] > 0 and min(split.values()) >= 0
        assert abs(sum(split.values()) - rows[name]["seconds"]) < 0.01
    assert "time_split" not in rows["hf_assisted"]
    assert rows["plain"]["requests_per_step"] == 1.0 and rows["ngram"]["verify_ms_per_step"] > 0
    for m in out["methods"][1:]:  # the identity report: lossless only when every output is identical
        assert (m["identical_share"] == 1.0) == m["lossless"] and (m["first_divergence"] is None) == m["lossless"]


def test_bench_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    assert cli.main(["bench", "--prompts", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "bad.jsonl:2" in err and "\n" not in err
    bad.write_bytes(b'{"prompt": "ok"}\n\n{"prompt": "\xff\xfe"}\n')
    assert cli.main(["bench", "--prompts", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "bad.jsonl:3: not UTF-8" in err and "\n" not in err
    good = write_prompts(tmp_path / "p.jsonl")
    assert cli.main(["bench", "--prompts", str(good), "--methods", "plain,warp"]) == 2
    assert "unknown bench method 'warp'" in capsys.readouterr().err


def test_generate_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["generate", "--prompt", "def main(", "--max-new-tokens", "8", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["outputs"][0]["token_ids"]) <= 8 and out["stats"]["method"] == "ar_draft"


def test_method_suffixes_set_the_scheduler_and_the_block() -> None:
    from dspark_core.cli.bench import method_params
    from dspark_core.config import EngineConfig

    cfg = EngineConfig()
    assert method_params("dspark_markov/prefix@4", cfg) == {"drafter.method": "dspark", "spec.head": "markov",
                                                            "drafter.path": None, "spec.scheduler": "prefix",
                                                            "spec.block_size": 4}
    assert method_params("dflash@learned", cfg)["spec.gamma_policy"] == "learned"
    assert "spec.block_size" not in method_params("dspark_rnn", cfg)
    assert method_params("hybrid_markov/prefix%0", cfg)["drafter.draft_vocab"] == 0  # the whole vocabulary
    assert method_params("dspark_markov@4%4096", cfg)["drafter.draft_vocab"] == 4096
    assert "drafter.draft_vocab" not in method_params("dspark_markov", cfg)  # the drafter's own default
    assert method_params("suffix/prefix~nocorpus", cfg) == {"drafter.method": "suffix", "spec.scheduler": "prefix",
                                                           "drafter.suffix_corpus": "none"}
    assert method_params("hybrid_markov/prefix~corpus", cfg)["drafter.suffix_corpus"] == "auto"
    assert "drafter.suffix_corpus" not in method_params("suffix", cfg)  # the config's (auto unless it says)
    for bad, why in (("ngram%0", "DSpark and hybrid"), ("dspark_markov%0/prefix", "token count"),
                     ("ngram~corpus", "a ~ suffix"), ("suffix~cold", "a ~ suffix")):
        with pytest.raises(DSparkError, match=why):
            method_params(bad, cfg)


def test_bench_counts_a_hybrids_rounds_per_proposer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The hybrid's JSON row says how many request rounds each proposer drafted over the timed passes (the warm-up
    left out) and how its tokens fared; the device names the CPU capability its figures were measured on."""
    import torch

    prompts = write_prompts(tmp_path / "p.jsonl")
    rc = cli.main(["bench", "--prompts", str(prompts), "--max-new-tokens", "12", "--repeats", "2",
                   "--methods", "plain,suffix,hybrid_markov", "--block-size", "4", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert torch.backends.cpu.get_cpu_capability() in out["device"]
    rows = {m["name"]: m for m in out["methods"]}
    assert "proposers" not in rows["plain"] and "proposers" not in rows["suffix"]
    counts = rows["hybrid_markov"]["proposers"]
    assert set(counts) == {"suffix", "dspark"}
    drafted = sum(c["drafts"] for c in counts.values())
    assert 0 < drafted <= 2 * 2 * 12  # at most one draft per request round: 2 passes x 2 prompts x 12 tokens
    for c in counts.values():
        assert 0 <= c["accepted"] <= c["verified"] <= c["proposed"]
        if c["proposed"]:
            assert c["acceptance"] == round(c["accepted"] / c["proposed"], 4)
    # suffix proposals by tree: the tiny target has no frozen corpus, so none came from one
    assert "suffix_sources" not in rows["plain"]
    for name in ("suffix", "hybrid_markov"):
        src = rows[name].get("suffix_sources", {"request": 0, "global": 0, "corpus": 0})
        assert src["corpus"] == 0 and src["request"] + src["global"] >= counts["suffix"]["drafts"] * (name != "suffix")
        taken = rows[name].get("suffix_taken")
        if taken is not None:  # the drafts verified by tree: a hybrid's are the rounds it took suffix's
            drafts = sum(t["drafts"] for t in taken.values())
            assert drafts == (counts["suffix"]["drafts"] if name != "suffix" else drafts)
            assert all(t["drafts"] <= src[k] for k, t in taken.items())
            if name != "suffix":
                assert sum(t["accepted"] for t in taken.values()) == counts["suffix"]["accepted"]
