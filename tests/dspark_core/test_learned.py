"""The learned verification-length policy: round logs from the engine, training, and the policy inside the engine
(greedy output identical to plain decoding). The stopping-rule losslessness tests sit with the other schedulers
in test_schedulers_lossless.py."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import engine_config, random_drafter, random_model

from dspark_core.engine import Engine
from dspark_core.errors import DSparkError
from dspark_core.training.train_policy import load_rounds, train_policy
from dspark_core.verification.learned import FEATURES, PolicyFile
from dspark_core.verification.round_log import LogHeader, RoundRecord, read_log
from dspark_core.verification.sampling import SamplingParams
from dspark_core.verification.sps import SpsTable, SpsTableFile
from dspark_core.verification.verify_scheduler import build_verify_scheduler

PROMPTS = [[1, 2, 3, 4, 5], [7], [9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9], [3, 1, 4, 1, 5, 9, 2, 6]]
SP = SamplingParams(max_new_tokens=24, ignore_eos=True)
SPS = SpsTable.from_probes([(1, 1.0), (4, 0.95), (8, 0.7), (16, 0.5), (32, 0.3)], 256)


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    return random_model(11)


def _run(target, scheduler: str, tmp_path, **spec) -> list[list[int]]:
    cfg = engine_config(block=6, max_requests=3, method="dspark")
    cfg.spec.scheduler = scheduler  # type: ignore[assignment]
    for k, v in spec.items():
        setattr(cfg.spec, k, v)
    sched = build_verify_scheduler(cfg, target, sps=SPS)
    eng = Engine(cfg, target=target, drafter=random_drafter(target, block=6), scheduler=sched)
    return [o.token_ids for o in eng.generate(PROMPTS, SP).outputs]


def test_log_train_and_serve_the_policy(target, tmp_path) -> None:
    plain = [o.token_ids for o in Engine(engine_config(method="plain"), target=target).generate(PROMPTS, SP).outputs]
    log = tmp_path / "rounds.jsonl"
    assert _run(target, "verify_all", tmp_path, round_log=str(log)) == plain
    header, rounds = read_log(log)
    assert header.scheduler == "verify_all" and header.block_size == 6
    assert list(header.sps.sample_batch_tokens) == list(SPS.sample_batch_tokens)
    assert len(rounds) >= 8 and all(r.seconds > 0 for r in rounds)
    first = rounds[0]
    assert first.running == 3 and first.waiting == 1  # 4 prompts, 3 slots
    assert all(len(e) == len(c) == v for e, c, v in zip(first.entropy, first.confidence, first.verified, strict=True))
    assert all(0 <= a <= v for a, v in zip(first.accepted, first.verified, strict=True))
    assert all(e >= 0 for row in first.entropy for e in row)

    policy, scores = train_policy(load_rounds([log]))
    assert set(scores) >= {"verify_all", "prefix", "learned", "oracle"} and scores["learned"] > 0
    assert scores["oracle"] >= max(scores["verify_all"], scores["prefix"], scores["learned"])
    path = policy.save(tmp_path / "policy.json")
    assert PolicyFile.load(path) == policy
    # any weights give a stopping rule: greedy output stays the target's
    assert _run(target, "learned", tmp_path, policy_path=str(path)) == plain


def test_learned_without_a_policy_is_one_clear_error(target, tmp_path) -> None:
    with pytest.raises(DSparkError, match="spec.policy_path is empty"):
        _run(target, "learned", tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text('{"features": ["bias"], "mean": [0], "scale": [1], "weights": [1], "gamma": 4}')
    with pytest.raises(DSparkError, match="differ from this engine's"):
        _run(target, "learned", tmp_path, policy_path=str(bad))


def _synthetic_log(path, rounds: int, seed: int) -> None:
    """Rounds where the confidence head is overconfident on 'hard' requests (low rolling acceptance): the prefix
    scheduler trusts c = 0.9 and verifies long blocks there; the log says only the first token survives."""
    rng = random.Random(seed)
    sps = SpsTable.from_probes([(b, 1.0 / (0.05 + 0.01 * b)) for b in range(1, 65)], 64)
    lines = [LogHeader(block_size=8, scheduler="verify_all", sps=SpsTableFile(**sps.to_dict())).model_dump_json()]
    for _ in range(rounds):
        hard = [rng.random() < 0.5 for _ in range(4)]
        conf = [[0.9] * 8 for _ in hard]
        acc = [min(1, rng.randrange(3)) if h else rng.randrange(5, 9) for h in hard]
        rec = RoundRecord(running=4, waiting=0, confidence=conf, entropy=[[1.0] * 8 for _ in hard],
                          recent_acceptance=[0.1 if h else 0.8 for h in hard], verified=[8] * 4, accepted=acc,
                          batch_tokens=36, seconds=0.05 + 0.01 * 36 + 0.02)
        lines.append(rec.model_dump_json())
    path.write_text("\n".join(lines) + "\n")


def test_training_beats_the_prefix_scheduler_when_confidences_mislead(tmp_path) -> None:
    log = tmp_path / "synthetic.jsonl"
    _synthetic_log(log, 300, seed=3)
    data = load_rounds([log])
    policy, scores = train_policy(data)
    assert scores["learned"] > 1.1 * scores["prefix"], scores
    w = dict(zip(FEATURES, policy.weights, strict=True))
    assert w["recent_acceptance"] > 0  # it learned to read the request's history, which the confidence ignores


def test_bad_logs_are_one_line_each(tmp_path) -> None:
    with pytest.raises(DSparkError, match="not found"):
        read_log(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "x"}\n')
    with pytest.raises(DSparkError, match=r"bad.jsonl:1 is not a round-log header"):
        read_log(bad)
    _synthetic_log(bad, 2, seed=0)
    bad.write_text(bad.read_text() + "{not json}\n")
    with pytest.raises(DSparkError, match=r"bad.jsonl:4: not valid JSON"):
        read_log(bad)


def test_a_round_log_appends_only_to_its_own_kind_of_file(tmp_path) -> None:
    from dspark_core.verification.round_log import RoundLog

    other = tmp_path / "notes.txt"
    other.write_text("my notes\n")
    with pytest.raises(DSparkError, match="is not a round log"):
        RoundLog(other, 8, "verify_all", SPS)
    assert other.read_text() == "my notes\n"  # untouched
    log = tmp_path / "rounds.jsonl"
    _synthetic_log(log, 1, seed=0)  # block 8, another SPS table
    with pytest.raises(DSparkError, match="another setting"):
        RoundLog(log, 8, "verify_all", SPS)
    table = SpsTable.from_probes([(b, 1.0 / (0.05 + 0.01 * b)) for b in range(1, 65)], 64)  # the synthetic log's
    same = RoundLog(log, 8, "verify_all", table)
    same.write(read_log(log)[1][0])
    same.close()
    assert len(read_log(log)[1]) == 2


def test_a_bundle_names_its_policy_relative_to_dspark_yaml(tmp_path) -> None:
    from dspark_core.config import load_config

    (tmp_path / "dspark.yaml").write_text("spec:\n  scheduler: learned\n  policy_path: policy.json\n")
    cfg = load_config(tmp_path / "dspark.yaml")
    assert cfg.spec.policy_path == str(tmp_path / "policy.json")


def test_a_dropped_feature_is_out_of_the_policy_and_the_engine_skips_it(target, tmp_path) -> None:
    log = tmp_path / "synthetic.jsonl"
    _synthetic_log(log, 120, seed=5)
    policy, scores = train_policy(load_rounds([log]), drop=("entropy",))
    w = dict(zip(FEATURES, policy.weights, strict=True))
    assert w["entropy"] == 0.0 and w["recent_acceptance"] > 0 and not policy.uses("entropy")
    assert policy.trained_on["dropped"] == "entropy" and scores["learned"] > scores["prefix"]
    with pytest.raises(DSparkError, match="cannot drop bias"):
        train_policy(load_rounds([log]), drop=("bias",))
    # the engine computes the draft entropy only for a policy that reads it (or a round log)
    full, _ = train_policy(load_rounds([log]))
    for pol, wants in ((policy, False), (full.model_copy(update={"weights": [0.1] * len(FEATURES)}), True)):
        path = pol.save(tmp_path / "p.json")
        cfg = engine_config(block=6, max_requests=3, method="dspark")
        cfg.spec.scheduler, cfg.spec.policy_path = "learned", str(path)  # type: ignore[assignment]
        eng = Engine(cfg, target=target, drafter=random_drafter(target, block=6),
                     scheduler=build_verify_scheduler(cfg, target, sps=SPS))
        assert eng.drafter.want_entropy is wants  # type: ignore[union-attr]
