"""`bench --methods dspark_markov/learned` takes the policy committed beside the model's drafters, as `profile`
finds it, instead of failing on an empty spec.policy_path."""

from __future__ import annotations

from dspark_core.cli.bench import committed_policy_paths, method_params
from dspark_core.config import EngineConfig, apply_params


def test_a_learned_method_takes_the_committed_policies(folder):
    base = EngineConfig(device="cpu")
    base.model.path, base.weights.dtype = str(folder), "bf16"
    cfg = committed_policy_paths(apply_params(base, method_params("dspark_markov/learned@learned", base)))
    assert cfg.spec.policy_path.endswith("policy_cpu_bf16_markov.json")
    assert cfg.spec.gamma_policy_path.endswith("gamma_cpu_bf16_markov.json")
    rnn = committed_policy_paths(apply_params(base, method_params("dspark_rnn/learned", base)))
    assert not rnn.spec.policy_path  # none committed for this head: the engine then says which to train
    given = apply_params(base, {**method_params("dspark_markov/learned", base), "spec.policy_path": "/mine.json"})
    assert committed_policy_paths(given).spec.policy_path == "/mine.json"  # an explicit one is kept
