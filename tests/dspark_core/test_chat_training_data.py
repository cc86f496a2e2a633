"""Chat data for drafter training (issue 42): prompts that keep the benchmark's chat prompts held out, rows the target
continues to one length, and the training curve's points."""

from __future__ import annotations

import json
import re
from pathlib import Path

from dspark_core.training.chat_prompts import TURN, chat_prompts, chat_texts, is_heldout_text
from dspark_core.training.curve import TrainingCurve, heldout_sets
from dspark_core.training.target_data import target_rows

ROOT = Path(__file__).resolve().parents[2]
BENCH_CHAT = ROOT / "benchmarks" / "prompts" / "heldout_chat.jsonl"


def test_no_prompt_is_or_names_a_benchmark_chat_prompt() -> None:
    bench = [json.loads(line)["prompt"] for line in BENCH_CHAT.read_text().splitlines() if line.strip()]
    texts = chat_texts()
    assert len(texts) > 400
    assert not {TURN.format(text=t) for t in texts} & set(bench)
    for topic in ("hash table", "pancake", "recursion", "refrigerator", "romeo"):
        assert not any(re.search(rf"\b{topic}\b", t, re.IGNORECASE) for t in texts), topic
    from dspark_core.safe_yaml import load_yaml
    from dspark_core.training.chat_prompts import DATA

    avoid = load_yaml(DATA.read_text(encoding="utf-8"), DATA)[0]["avoid"]
    def names(topic: str, text: str) -> bool:  # the word or its inflections: focus, focused; vaccine, vaccines
        return re.search(rf"\b{re.escape(topic)}(s|es|ed|ing)?\b", text, re.IGNORECASE) is not None

    for prompt in bench:  # every benchmark prompt names a topic that no training text names
        named = [a for a in avoid if names(a, prompt)]
        assert named, prompt
        assert not any(names(a, t) for a in named for t in texts), named
    train = {t for t in texts if not is_heldout_text(t)}
    held = {t for t in texts if is_heldout_text(t)}
    assert held and train and not train & held


def test_prompts_fit_and_repeat_only_when_the_split_is_used_up(tiny_tokenizer) -> None:
    got = chat_prompts(tiny_tokenizer.encode, 50, max_len=200, seed=3, heldout=False)
    assert len(got) == 50 and all(len(p) <= 200 for p in got)
    assert len({tuple(p) for p in got}) == 50  # the split holds more than 50 prompts
    assert chat_prompts(tiny_tokenizer.encode, 50, max_len=200, seed=3, heldout=False) == got  # seeded


def test_rows_share_one_length_and_chat_rows_start_after_their_prompt(tiny_target, tiny_tokenizer) -> None:
    from dspark_core.config import ASSETS

    data, starts = target_rows(tiny_target, ASSETS / "target", sequences=6, prompt_len=110, gen_len=12,
                               greedy_fraction=1.0, temperature=0.0, seed=0, heldout=False, chat_fraction=0.5)
    assert data.tokens.shape == (6, 122) and data.prompt_len == 110
    assert starts[:3] == [110] * 3 and all(s < 110 for s in starts[3:])
    prompts = chat_prompts(tiny_tokenizer.encode, 3, max_len=109, seed=0, heldout=False)
    assert sorted(data.tokens[i, :starts[i]].tolist() for i in range(3, 6)) == sorted(prompts)


def test_the_curve_appends_a_point_per_step_once(tiny_target, tmp_path: Path) -> None:
    from conftest import random_drafter

    from dspark_core.config import ASSETS

    held = heldout_sets(tiny_target, ASSETS / "target", prompt_len=110, gen_len=16, seed=1, chat=True)
    assert set(held) == {"code", "chat"}
    drafter = random_drafter(tiny_target, block=4).model
    curve = TrainingCurve(tmp_path / "curve.jsonl", held, tiny_target, 4)
    first = curve.point(10, drafter)
    assert curve.point(10, drafter) is first  # the final call at a step already measured adds nothing
    curve.point(20, drafter)
    lines = [json.loads(line) for line in (tmp_path / "curve.jsonl").read_text().splitlines()]
    assert [p["step"] for p in lines] == [10, 20]
    assert 1.0 <= first["code_tau"] <= 5.0 and len(first["chat_accept"]) == 4


def test_a_fresh_run_drops_only_a_curve_it_wrote(tmp_path: Path) -> None:
    from dspark_core.training.curve import drop_curve

    ours, theirs = tmp_path / "curve.jsonl", tmp_path / "other" / "curve.jsonl"
    ours.write_text(json.dumps({"step": 10, "code_tau": 1.5}) + "\n")
    theirs.parent.mkdir()
    theirs.write_text("my notes\n")
    assert drop_curve(ours) and not ours.exists()
    assert not drop_curve(theirs) and theirs.read_text() == "my notes\n"
    assert not drop_curve(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty" / "curve.jsonl"
    empty.parent.mkdir()
    empty.write_text("")
    assert not drop_curve(empty) and empty.exists()  # nothing in it says this command wrote it
