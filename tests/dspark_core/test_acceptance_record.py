"""bench --record-acceptance: verify_all DSpark rows go into their committed drafter's acceptance.json, one entry
per domain, merged with what is there; other rows, and drafters the user pointed drafter.path at, are left out."""

from __future__ import annotations

import json

import dspark_core.cli.acceptance_record as rec
from dspark_core.config import EngineConfig


def _result(names: list[str]) -> dict:
    rows = [{"name": n, "tau": 3.0, "position_acceptance": [0.9, 0.7]} for n in names]
    return {"methods": [{"name": "plain", "tau": 1.0, "position_acceptance": []}, *rows], "prompts": 8,
            "max_new_tokens": 128, "device": "cpu (2 threads)"}


def test_records_per_domain_and_merges(tmp_path, monkeypatch) -> None:
    folders = {h: tmp_path / h for h in ("markov", "none")}
    for f in folders.values():
        f.mkdir()
    (folders["markov"] / "sts.json").write_text(json.dumps({"temperatures": [1, 1], "ece_after": [0.02, 0.04]}))
    monkeypatch.setattr(rec, "drafter_path", lambda cfg: str(folders[cfg.spec.head]))
    cfg = EngineConfig(device="cpu")
    written = rec.record_acceptance(_result(["dspark_markov", "dflash", "dspark_markov/prefix"]), cfg, "code", "cmd")
    assert sorted(p.parent.name for p in written) == ["markov", "none"]
    rec.record_acceptance(_result(["dspark_markov/verify_all"]), cfg, "chat", "cmd2")
    data = json.loads((folders["markov"] / "acceptance.json").read_text())
    assert set(data["domains"]) == {"code", "chat"}
    code = data["domains"]["code"]
    assert code["gamma"] == 2 and code["tau"] == 3.0 and code["confidence_ece"] == 0.03 and code["command"] == "cmd"
    assert data["domains"]["chat"]["command"] == "cmd2"


def test_a_user_drafter_is_never_written(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(rec, "drafter_path", lambda cfg: str(tmp_path))
    cfg = EngineConfig(device="cpu")
    cfg.drafter.path = str(tmp_path)
    assert rec.record_acceptance(_result(["dspark_markov"]), cfg, "code", "cmd") == []
    assert not (tmp_path / "acceptance.json").exists()
