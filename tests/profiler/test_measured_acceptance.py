"""A committed drafter's measured acceptance (acceptance.json, from `bench --record-acceptance`) reaches the
profile's accept.* for the workload's domain, and the simulator then uses the searched head's measured figures."""

from __future__ import annotations

import json

from profiler.drafter import measured_acceptance
from profiler.schema import Profile
from tuner.acceptance import acceptance_for


def _write(root, head: str, domain: str, pa: list[float], tau: float) -> None:
    d = root / "drafters" / head
    d.mkdir(parents=True, exist_ok=True)
    entry = {"gamma": len(pa), "tau": tau, "position_acceptance": pa, "confidence_ece": 0.02,
             "command": f"python cli.py bench --methods dspark_{head}"}
    (d / "acceptance.json").write_text(json.dumps({"domains": {domain: entry}}))


def test_measured_acceptance_per_domain_and_head(tmp_path) -> None:
    _write(tmp_path, "markov", "code", [0.9, 0.8, 0.7], 3.2)
    _write(tmp_path, "none", "code", [0.85, 0.6, 0.4], 2.4)
    acc, notes = measured_acceptance(tmp_path, "code")
    assert acc is not None and acc.drafter.endswith("/markov") and acc.tau == 3.2 and acc.domain == "code"
    assert acc.per_head == {"markov": [0.9, 0.8, 0.7], "none": [0.85, 0.6, 0.4]}
    assert acc.source.startswith("measured: python cli.py bench") and "code" in notes[0]
    profile = Profile.model_validate({"workload": {"domain": "code"}, "accept": acc.model_dump()})
    model = acceptance_for(profile, "none")
    assert model.alphas(3) == [0.85, 0.6, 0.4] and model.source.startswith("measured (none)")
    assert acceptance_for(profile, "markov").alphas(3) == [0.9, 0.8, 0.7]


def test_another_domain_keeps_the_prior(tmp_path) -> None:
    _write(tmp_path, "markov", "code", [0.9, 0.8], 2.5)
    acc, notes = measured_acceptance(tmp_path, "chat")
    assert acc is None and "not chat" in notes[0]
    assert measured_acceptance(tmp_path / "nothing", "code") == (None, [])
