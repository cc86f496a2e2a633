"""The learned block length: features, the block choice, training from round logs, and the policy inside the engine
(greedy output identical to plain decoding). Its sampling-distribution test sits with the schedulers' in
test_schedulers_lossless.py."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import engine_config, random_drafter, random_model

from dspark_core.engine import Engine
from dspark_core.errors import DSparkError
from dspark_core.training.train_gamma import fit_cost, load_gamma_rounds, train_gamma_policy
from dspark_core.verification.gamma_policy import (
    COST_TERMS,
    GAMMA_FEATURES,
    GammaPolicyFile,
    TokenClasses,
    choose_blocks,
    text_features,
)
from dspark_core.verification.round_log import LogHeader, RoundRecord, read_log
from dspark_core.verification.sampling import SamplingParams
from dspark_core.verification.sps import SpsTable, SpsTableFile
from dspark_core.verification.verify_scheduler import build_verify_scheduler

PROMPTS = [[1, 2, 3, 4, 5], [7], [9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9], [3, 1, 4, 1, 5, 9, 2, 6]]
SP = SamplingParams(max_new_tokens=24, ignore_eos=True)
SPS = SpsTable.from_probes([(b, 1.0 / (0.05 + 0.002 * b)) for b in range(1, 65)], 64)


def _cost(**terms: float) -> list[float]:
    return [terms.get(t, 0.0) for t in COST_TERMS]


def _policy(weights: list[float], cost: list[float], gamma_max: int = 8) -> GammaPolicyFile:
    return GammaPolicyFile(features=list(GAMMA_FEATURES), mean=[0.0] * 6, scale=[1.0] * 6, weights=weights,
                           cost_terms=list(COST_TERMS), cost=cost, gamma_max=gamma_max)


def test_text_features_describe_the_recent_tokens() -> None:
    classes = TokenClasses(newline=frozenset({10}), symbol=frozenset({10, 11}))
    assert text_features([], classes) == [0.0, 0.0, 0.0]
    repeat, newline, symbol = text_features([5, 6, 7, 10, 5, 11, 6, 8], classes)
    assert (repeat, newline, symbol) == (0.0, 0.125, 0.25)  # all 8 are the window: nothing before it to repeat
    long = list(range(100, 400)) + [120, 121, 10, 11]  # last 32: 28 fresh, 2 seen in the 256 before, 2 symbols
    assert text_features(long, classes) == [pytest.approx(2 / 32), 1 / 32, 2 / 32]


def test_token_classes_of_a_real_tokenizer(tiny_tokenizer) -> None:
    classes = TokenClasses.from_tokenizer(tiny_tokenizer)
    nl = tiny_tokenizer.encode("\n")
    word = tiny_tokenizer.encode("hello")
    assert nl and all(t in classes.newline and t in classes.symbol for t in nl)
    assert not any(t in classes.symbol for t in word)


def test_the_block_follows_acceptance_and_cost() -> None:
    cheap = _policy([0.0] * 6, _cost(draft=0.001, position=0.0005))
    sure, hopeless = [0.99 ** j for j in range(1, 9)], [0.01 ** j for j in range(1, 9)]
    assert choose_blocks(cheap, SPS, [sure], [8], 8) == [8]  # near-sure drafts: the longest block
    assert choose_blocks(cheap, SPS, [hopeless], [8], 8) == [0]  # hopeless drafts: a plain step
    assert choose_blocks(cheap, SPS, [sure], [3], 8) == [3]  # a request near its end
    per_position = _policy([0.0] * 6, _cost(draft=0.001, position=0.02))  # a drafted position: 40% of a step
    (mid,) = choose_blocks(per_position, SPS, [[0.8 ** j for j in range(1, 9)]], [8], 8)
    assert 1 <= mid < 8
    assert choose_blocks(cheap, SPS, [sure], [8], 5) == [5]  # never above spec.block_size
    per_row = _policy([0.0] * 6, _cost(draft=0.001, draft_row=0.01, position=0.0005))  # a drafting row: 20% of a step
    assert choose_blocks(per_row, SPS, [hopeless, sure, hopeless], [8] * 3, 8) == [0, 8, 0]  # only the sure one
    survival = _policy([1.0, 0.0, 2.0, 0.0, 0.0, 0.0], _cost()).survival(1.0, [0.0] * 3, 4)
    assert all(a > b for a, b in zip(survival, survival[1:], strict=False))  # P(prefix survives) only falls


def test_a_policy_file_is_checked(tmp_path) -> None:
    with pytest.raises(DSparkError, match="not found; train one with"):
        GammaPolicyFile.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"features": ["bias"], "mean": [0], "scale": [1], "weights": [1], "cost_terms": [], '
                   '"cost": [], "gamma_max": 4}')
    with pytest.raises(DSparkError, match="differ from this engine's"):
        GammaPolicyFile.load(bad)
    good = _policy([0.0] * 6, _cost())
    assert GammaPolicyFile.load(good.save(tmp_path / "g.json")) == good


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return random_model(11)


def _engine(target, block: int, max_requests: int = 3, **spec) -> Engine:
    cfg = engine_config(block=block, max_requests=max_requests, method="dspark")
    for k, v in spec.items():
        setattr(cfg.spec, k, v)
    sched = build_verify_scheduler(cfg, target, sps=SPS)
    sched.classes = TokenClasses(newline=frozenset(range(0, 48, 4)), symbol=frozenset(range(0, 48, 3)))
    return Engine(cfg, target=target, drafter=random_drafter(target, block=6), scheduler=sched)


def test_log_train_and_serve_the_gamma_policy(target, tmp_path) -> None:
    plain = [o.token_ids for o in Engine(engine_config(method="plain"), target=target).generate(PROMPTS, SP).outputs]
    logs = [tmp_path / "rounds_plain.jsonl"]
    cfg = engine_config(block=6, max_requests=3, method="plain")
    cfg.spec.round_log = str(logs[0])
    assert [o.token_ids for o in Engine(cfg, target=target).generate(PROMPTS, SP).outputs] == plain
    steps = read_log(logs[0])[1]
    assert len(steps) >= 8 and all(r.drafted == [0] * r.running and r.seconds > 0 for r in steps)  # plain steps
    for block in (3, 6):
        logs.append(tmp_path / f"rounds_b{block}.jsonl")
        assert [o.token_ids for o in _engine(target, block, round_log=str(logs[-1])).generate(PROMPTS, SP).outputs] \
            == plain
    header, rounds = read_log(logs[-1])
    assert all(len(r.text) == len(r.drafted) == len(r.context) == r.running for r in rounds)
    assert rounds[1].context[0] > rounds[0].context[0] >= len(PROMPTS[0])
    assert all(len(t) == 3 and all(0.0 <= v <= 1.0 for v in t) for r in rounds for t in r.text)
    assert max(max(r.drafted) for r in rounds) == 6

    policy, scores = train_gamma_policy(load_gamma_rounds(logs))
    assert policy.gamma_max == 6 and scores["rounds_heldout"] > 0
    assert scores["oracle"] >= scores["learned"] > 0 and scores["oracle"] >= scores["best_static"]
    path = policy.save(tmp_path / "gamma.json")
    # any policy only picks how many tokens to draft: greedy output stays the target's, whatever blocks it picks
    eng = _engine(target, 6, gamma_policy="learned", gamma_policy_path=str(path))
    picked: list[int] = []
    choose = eng.scheduler.round_block
    eng.scheduler.round_block = lambda running, block: picked.append(choose(running, block)) or picked[-1]
    assert [o.token_ids for o in eng.generate(PROMPTS, SP).outputs] == plain
    assert picked and all(0 <= g <= 6 for g in picked)
    swinging = _policy([0.0, 0.0, 0.0, 0.0, 0.0, 40.0], _cost(draft=0.004, position=0.002), gamma_max=6)
    swinging.mean[5] = 0.5  # a symbol share above a half accepts everything, below it nothing
    path = swinging.save(tmp_path / "swinging.json")
    eng = _engine(target, 6, max_requests=1, gamma_policy="learned", gamma_policy_path=str(path))
    picked.clear()
    choose = eng.scheduler.round_block
    eng.scheduler.round_block = lambda running, block: picked.append(choose(running, block)) or picked[-1]
    assert [o.token_ids for o in eng.generate(PROMPTS, SP).outputs] == plain
    assert 0 in picked and 6 in picked, picked  # plain steps and full blocks both ran


def test_learned_gamma_without_a_policy_is_one_clear_error(target) -> None:
    with pytest.raises(DSparkError, match="spec.gamma_policy_path is empty"):
        _engine(target, 6, gamma_policy="learned")


def _log(path, block: int, rounds: int, seed: int, scheduler: str = "verify_all") -> None:
    """Synthetic traffic: code-like requests (many line breaks) accept ~all of a block, chat-like ones nothing; a
    round costs the SPS step plus 2 ms per 1000 context tokens, and when it drafts 4 ms + 1 ms per drafted position
    (block 0: plain steps)."""
    rng = random.Random(seed)
    lines = [LogHeader(block_size=max(1, block), scheduler=scheduler,
                       sps=SpsTableFile(**SPS.to_dict())).model_dump_json()]
    for _ in range(rounds):
        code = rng.random() < 0.5
        acc = rng.randrange(block - 1, block + 1) if code and block else 0
        text = [0.5, 0.4, 0.5] if code else [0.1, 0.0, 0.1]
        ctx = rng.randrange(100, 3000)
        extra = 0.002 * ctx / 1000 + (0.004 + 0.001 * block if block else 0.0)
        rec = RoundRecord(running=1, waiting=0, confidence=[[0.5] * block], entropy=[[]], recent_acceptance=[0.5],
                          verified=[block], accepted=[acc], drafted=[block], text=[text], context=[ctx],
                          batch_tokens=block + 1, seconds=1.0 / SPS.lookup(block + 1) + extra + rng.uniform(0, 1e-4))
        lines.append(rec.model_dump_json())
    path.write_text("\n".join(lines) + "\n")


def test_training_learns_the_text_and_the_cost(tmp_path) -> None:
    logs = [tmp_path / "plain.jsonl", tmp_path / "b2.jsonl", tmp_path / "b8.jsonl"]
    _log(logs[0], 0, 200, seed=0)
    _log(logs[1], 2, 200, seed=1)
    _log(logs[2], 8, 400, seed=2)
    rounds = load_gamma_rounds(logs)
    cost = dict(zip(COST_TERMS, fit_cost(rounds), strict=True))
    assert cost["context"] == pytest.approx(0.002, abs=2e-4)
    assert cost["round"] + cost["row"] == pytest.approx(0.0, abs=2e-4)  # one batch size: one intercept
    assert cost["draft"] + cost["draft_row"] == pytest.approx(0.004, abs=3e-4)
    assert cost["position"] + cost["row_position"] == pytest.approx(0.001, abs=1e-4)
    policy, scores = train_gamma_policy(rounds)
    assert scores["learned"] > 1.15 * scores["best_static"], scores  # plain on chat, the full block on code
    assert scores["learned"] >= 0.97 * scores["oracle"]
    assert 0.3 < scores["plain_share_learned"] < 0.7
    with pytest.raises(DSparkError, match="one block length only"):
        train_gamma_policy(load_gamma_rounds([logs[0], logs[2]]))
    with pytest.raises(DSparkError, match="no plain step"):
        train_gamma_policy(load_gamma_rounds(logs[1:]))


def test_logs_without_text_features_are_refused(tmp_path) -> None:
    log = tmp_path / "old.jsonl"
    _log(log, 4, 3, seed=0)
    lines = log.read_text().splitlines()
    lines[1] = lines[1].replace('"text":[[0.5,0.4,0.5]]', '"text":[]').replace('"text":[[0.1,0.0,0.1]]', '"text":[]')
    log.write_text("\n".join(lines) + "\n")
    with pytest.raises(DSparkError, match="old.jsonl: round 1 has no text features or context"):
        load_gamma_rounds([log])


def test_explore_logs_every_block_length_and_stays_lossless(target, tmp_path) -> None:
    plain = [o.token_ids for o in Engine(engine_config(method="plain"), target=target).generate(PROMPTS, SP).outputs]
    log = tmp_path / "explore.jsonl"
    eng = _engine(target, 6, gamma_policy="explore", round_log=str(log))
    assert [o.token_ids for o in eng.generate(PROMPTS, SP).outputs] == plain
    blocks = {max(r.drafted) for r in read_log(log)[1]}
    assert 0 in blocks and 6 in blocks and len(blocks) >= 4, blocks  # plain steps and blocks in 1..6, one log


def test_the_learned_block_length_is_the_dspark_drafters_alone(target, tmp_path) -> None:
    """The policy is fitted on the DSpark drafter's rounds: with another drafter `learned` is inert (the static block,
    no policy file read, none needed), with DSpark it picks the blocks."""
    from dspark_core.config import learned_gamma
    from dspark_core.drafters.base import VerifyAll
    from dspark_core.engine_parts import build_scheduler

    path = _policy([0.0] * 6, _cost(), gamma_max=6).save(tmp_path / "gamma.json")
    for method in ("ngram", "suffix", "hybrid"):
        cfg = engine_config(block=6, max_requests=1, method=method)
        cfg.spec.gamma_policy = "learned"  # no path: not read, so no error
        assert not learned_gamma(cfg) and isinstance(build_scheduler(cfg, target), VerifyAll)
    cfg = engine_config(block=6, max_requests=1, method="dspark")
    cfg.spec.gamma_policy, cfg.spec.gamma_policy_path = "learned", str(path)
    assert learned_gamma(cfg) and build_verify_scheduler(cfg, target, sps=SPS).gamma_policy is not None
