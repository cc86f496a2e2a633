"""A deployment's measured acceptance (`profile --from-monitor`) is kept by any later `tune` of the same model,
drafter and workload domain, whatever flags it repeats; the study is then a new one, not a resumed stale one."""

from __future__ import annotations

from kb.db import open_db
from kb.store import save_profile
from profiler.build import build_profile
from tuner.commands_tune import _default_study, resolve_profile

MONITORED = [0.91, 0.8, 0.7, 0.6]


def test_the_monitored_acceptance_survives_repeated_flags_and_another_gpu(tmp_path):
    db = open_db(f"sqlite:///{tmp_path / 'kb.sqlite'}")
    first = build_profile("Qwen3-8B", "h100", "code", measure=False)
    prior_source = first.accept.source
    prod = first.model_copy(deep=True)
    prod.accept.position_acceptance = MONITORED
    prod.accept.per_head = None
    prod.accept.source = "measured: monitor deployment 7 (http://127.0.0.1:1/metrics), 40 samples"
    save_profile(db, prod)
    other = build_profile("Qwen3-8B", "h100", "chat", measure=False)  # a later profile of another domain
    save_profile(db, other)
    for gpu, workload in (("h100", "code"), ("h200", "code"), ("h200", None)):  # None: the latest's (code) carries
        _, got = resolve_profile(db, "Qwen3-8B", gpu, workload)
        assert got.accept.position_acceptance == MONITORED and got.accept.source.startswith("measured: monitor ")
    _, chat = resolve_profile(db, "Qwen3-8B", "h100", "chat")
    assert not (chat.accept.source or "").startswith("measured: monitor")
    _, mine = resolve_profile(db, "Qwen3-8B", "h100", "code")
    plan = {"space": {}, "fixed": {}}
    assert _default_study(mine, plan, "simulate", ["throughput"], 0) != \
        _default_study(first, plan, "simulate", ["throughput"], 0)  # a new study, not the stale one resumed
    assert prior_source != mine.accept.source


def test_a_simulated_study_with_another_acceptance_is_another_study():
    from tuner.study import StudySpec

    p = build_profile("Qwen3-8B", "h100", "code", measure=False)
    q = p.model_copy(deep=True)
    q.accept.position_acceptance = MONITORED
    a = StudySpec(profile=p.model_dump(mode="json"), plan={}, mode="simulate")
    b = StudySpec(profile=q.model_dump(mode="json"), plan={}, mode="simulate")
    assert a.identity() != b.identity()  # `tune --study S` after a new measurement refuses to resume S
    m = StudySpec(profile=p.model_dump(mode="json"), plan={}, mode="measure")
    n = StudySpec(profile=q.model_dump(mode="json"), plan={}, mode="measure")
    assert m.identity() == n.identity()  # a measured study measures acceptance itself
