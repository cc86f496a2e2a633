"""The drafter catalogue of issue 37 (every method, cited acceptance) and `profile --drafter` / `--list-drafters`."""

from __future__ import annotations

import json

import pytest
import yaml

import cli
from profiler.catalog import CATALOG_DIR, DRAFTER_METHODS, drafters, models, resolve_model
from profiler.drafter import drafter_profile, published_acceptance

ROOT = CATALOG_DIR.parents[1]


@pytest.mark.parametrize("d", drafters(), ids=lambda d: d.id)
def test_every_drafter_is_sourced_and_targets_a_catalogue_model(d):
    names = {m.name for m in models()}
    assert d.target in names and d.method in DRAFTER_METHODS and d.source
    if d.draft_model:
        assert d.draft_model in names
    if d.method == "mtp" and d.mtp_modules is not None:  # the modules the target's own config.json declares
        cfg = resolve_model(d.target)[0].config
        assert (cfg.get("text_config") or cfg).get("num_nextn_predict_layers") == d.mtp_modules


ACCEPTANCE = [(d, a) for d in drafters() for a in d.acceptance]


@pytest.mark.parametrize("d, a", ACCEPTANCE, ids=[f"{d.id}:{a.domain}@{a.steps}" for d, a in ACCEPTANCE])
def test_published_acceptance_is_cited_and_plausible(d, a):
    """tau counts the bonus token: 1 <= tau <= steps + 1; the quoted words carry the figures."""
    assert a.source and a.quote and a.dataset and a.steps >= 1
    assert 1.0 <= a.tau <= a.steps + 1
    if a.datasets:  # a domain mean over benchmarks: the mean of the quoted per-benchmark figures
        assert abs(sum(a.datasets.values()) / len(a.datasets) - a.tau) <= 0.006
        assert all(f"{v:g}" in a.quote for v in a.datasets.values())
    else:
        assert f"{a.tau:g}" in a.quote
    for k, tau in (a.tau_at_steps or {}).items():
        assert 1.0 <= tau <= int(k) + 1 and f"{tau:g}" in a.quote
    if a.tau_at_steps:
        assert a.tau_at_steps[str(a.steps)] == a.tau


@pytest.mark.parametrize("d", [d for d in drafters() if d.acceptance_ref], ids=lambda d: d.id)
def test_acceptance_refs_resolve_to_table1_rows(d):
    ref = d.acceptance_ref
    table = yaml.safe_load((ROOT / ref.file).read_text())[ref.table]
    row = table[ref.model][ref.method]
    assert len(row) == 4 and all(1.0 <= x <= ref.steps + 1 for x in row)


def test_every_method_and_the_new_targets_have_drafters():
    assert {d.method for d in drafters()} == set(DRAFTER_METHODS)
    targets = {d.target for d in drafters()}
    assert {"DeepSeek-V4-Flash", "DeepSeek-V4-Pro", "Kimi-K2-Instruct", "Kimi-K2.6", "gpt-oss-120b",
            "Llama-4-Maverick-17B-128E", "Qwen3-Next-80B-A3B"} <= targets


def run(capsys, *args):
    code = cli.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def profile_json(capsys, *args):
    code, out, err = run(capsys, "profile", *args, "--json", "--no-store")
    assert code == 0, err
    return json.loads(out)


def test_drafter_eagle3_sets_method_and_published_acceptance(capsys):
    p = profile_json(capsys, "--model", "llama-3.1-8b", "--gpu", "h100", "--drafter", "eagle3")
    assert p["drafter"]["method"] == "eagle3" and p["drafter"]["draft_vocab"] == 32000
    assert p["drafter"]["checkpoint"] == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B" and "id" not in p["drafter"]
    assert p["drafter"]["available"] == ["eagle3", "dflash", "ngram", "suffix", "none"]
    acc = p["accept"]
    assert acc["method"] == "eagle3" and acc["gamma"] == 7 and acc["tau"] == 2.77 and acc["domain"] == "chat"
    assert acc["source"].startswith("published (third_party)")


def test_drafter_mtp_takes_the_published_depth_curve(capsys):
    p = profile_json(capsys, "--model", "deepseek-r1", "--gpu", "b200", "--drafter", "MTP")
    assert p["model"]["mtp_modules"] == 1
    assert p["drafter"]["method"] == "mtp" and p["drafter"]["mtp_modules"] == 1
    acc = p["accept"]  # chat not published: the mixed figure, with tau per depth
    assert acc["domain"] == "mixed" and acc["gamma"] == 3 and acc["tau"] == 2.82
    assert acc["tau_at_gamma"] == {"1": 1.92, "2": 2.58, "3": 2.82, "4": 2.99, "5": 3.01}


def test_auto_on_a_new_model_takes_its_dspark_drafter(capsys):
    p = profile_json(capsys, "--model", "deepseek-v4-flash", "--gpu", "b300")
    d = p["drafter"]
    assert d["method"] == "dspark" and d["id"] == "deepseek-ai/DeepSeek-V4-Flash-0731" and d["block_size"] == 5
    assert d["available"] == ["dspark", "mtp", "ngram", "suffix", "none"]
    assert p["model"]["kv_state_bytes"] == 43 * 128 * 512 * 2 and p["model"]["mtp_modules"] == 1


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_host_methods_need_no_checkpoint(capsys, method):
    p = profile_json(capsys, "--model", "gemma-4-31b", "--gpu", "b300", "--drafter", method)
    assert p["drafter"]["method"] == method and p["drafter"]["available"] == ["ngram", "suffix", "none"]
    assert "checkpoint" not in p["drafter"] and not p.get("accept")


def test_catalogue_id_any_case(capsys):
    p = profile_json(capsys, "--model", "kimi-k2", "--drafter", "aq-medai/kimi-k2-instruct-eagle3")
    d = p["drafter"]
    assert d["checkpoint"] == "AQ-MedAI/Kimi-K2-Instruct-eagle3" and d["target_layers"] == [2, 30, 58]


@pytest.mark.parametrize("model, value, words", [
    ("gemma-4-31b", "bogus", "no such folder or catalogue drafter"),
    ("gemma-4-31b", "eagle3", "no published eagle3 drafter for Gemma-4-31B"),
    ("gemma-4-31b", "deepseek-ai/dspark_qwen3_8b_block7", "a drafter of Qwen3-8B, not of Gemma-4-31B"),
    ("kimi-k2", "mtp", "Kimi-K2-Instruct's config.json declares no MTP modules"),
    ("gpt-oss-20b", "dspark", "no published dspark drafter for gpt-oss-20b"),
])
def test_bad_drafter_is_one_line_naming_the_choices(capsys, model, value, words):
    code, _, err = run(capsys, "profile", "--model", model, "--drafter", value, "--no-store")
    line = err.strip()
    assert code == 2 and "\n" not in line and words in line and "ngram, suffix, none" in line


def test_mtp_modules_a_config_declares_without_a_catalogue_row(tmp_path, capsys):
    """A config.json of one's own with num_nextn_predict_layers: `--drafter mtp` (and auto) run its modules."""
    cfg = dict(resolve_model("DeepSeek-V3")[0].config, num_nextn_predict_layers=2)
    path = tmp_path / "my-v3" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    for choice in ("mtp", "auto"):
        d = profile_json(capsys, "--model", str(path), "--gpu", "h200", "--drafter", choice)["drafter"]
        assert d["method"] == "mtp" and d["mtp_modules"] == 2 and "num_nextn_predict_layers 2" in d["source"]
        assert d["available"] == ["mtp", "ngram", "suffix", "none"]
    cfg["num_nextn_predict_layers"] = 0
    path.write_text(json.dumps(cfg))
    code, _, err = run(capsys, "profile", "--model", str(path), "--drafter", "mtp", "--no-store")
    assert code == 2 and "declares no MTP modules" in err


def test_auto_keeps_dspark_first_and_table1_reference():
    d, _ = drafter_profile(None, "Qwen3-8B", None)
    assert d.method == "dspark" and d.id == "deepseek-ai/dspark_qwen3_8b_block7" and d.heads == ["markov"]
    assert published_acceptance(d, "Qwen3-8B", "math") == (None, [])  # DSpark: the simulator's Table 1 priors
    e, _ = drafter_profile("dflash", "Qwen3-8B", None)
    acc, _ = published_acceptance(e, "Qwen3-8B", "math")
    assert e.id is None and e.heads == ["none"] and acc.tau == 4.77 and acc.gamma == 7


def test_list_drafters(capsys):
    code, out, _ = run(capsys, "profile", "--list-drafters", "--json")
    assert code == 0 and sorted(d["id"] for d in json.loads(out)["drafters"]) == sorted(d.id for d in drafters())
    code, out, _ = run(capsys, "profile", "--list-drafters", "--model", "deepseek-v4-pro", "--json")
    assert code == 0 and [d["method"] for d in json.loads(out)["drafters"]] == ["dspark", "mtp"]
    code, out, _ = run(capsys, "profile", "--list-drafters", "--model", "kimi-k2.6")
    assert code == 0 and "nvidia/Kimi-K2.6-Eagle3" in out and "lightseekorg/kimi-k2.6-eagle3.1-mla" in out
    assert "2 published at K 3" in out and "1 published at K 3" in out


def test_summary_names_a_non_dspark_drafter(capsys):
    code, out, _ = run(capsys, "profile", "--model", "deepseek-r1", "--gpu", "b200", "--drafter", "mtp", "--no-store")
    assert code == 0 and "mtp: deepseek-ai/DeepSeek-R1" in out and "published (engine)" in out
