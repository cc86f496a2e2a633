"""`tune --deploy sglang|vllm|both`: the search holds only what the named engine(s) can run.

The facts are the ones the exported scripts refuse on (tuner/templates): SGLang 0.5.23 has no suffix decoding
(sglang.sh exits 2 on it), vLLM 0.33 runs only the vanilla Markov DSpark head (vllm.sh exits 2 on any other). A
study for both engines searches their intersection, so both scripts of its bundle run as shipped; one for a single
engine searches what that engine runs and exports only its script.
"""

from __future__ import annotations

from typing import Any

from tuner.engine_config import BUNDLED_METHODS
from tuner.errors import TunerError
from tuner.space import SearchSpace
from tuner.spec_targets import SGLANG_ALGORITHM
from tuner.targets import VLLM_HEADS

DEPLOYS = ("sglang", "vllm", "both", "dspark")  # dspark: the bundled engine only (its own config and script)
VLLM_METHODS = ("dspark", "dflash", "eagle3", "mtp", "draft_model", "ngram", "suffix")  # vLLM 0.33 speculative methods


def engines(deploy: str | None) -> tuple[str, ...]:
    """The serving stacks a bundle has scripts for (None: a study stored before --deploy, for both, unrestricted;
    dspark: none of them, only the bundled engine's config)."""
    if deploy == "dspark":
        return ()
    return ("sglang", "vllm") if deploy in (None, "both") else (deploy,)


def check(deploy: str) -> str:
    if deploy not in DEPLOYS:
        raise TunerError(f"--deploy {deploy!r}: choose sglang, vllm, both or dspark (the bundled engine)")
    return deploy


def why_not(engine: str, params: dict[str, Any]) -> str | None:
    """Why `engine` cannot run `params` (None: it can), in the words the script would use: the one place the
    engines' limits are stated (`restrict` asks it choice by choice)."""
    method = str(params.get("spec.method") or "dspark")
    if not params.get("spec.enabled", True) or method == "plain":  # speculation off: every engine runs it
        return None
    if engine == "sglang" and method not in SGLANG_ALGORITHM:
        return f"SGLang 0.5.23 has no {method} speculative decoding"
    if engine == "vllm" and method not in VLLM_METHODS:
        return f"vLLM 0.33 has no {method} speculative decoding"
    if engine == "vllm" and method == "dspark" and params.get("spec.head") not in VLLM_HEADS:
        return f"vLLM 0.33 runs only the Markov DSpark head (not {params.get('spec.head')})"
    if engine == "dspark" and method not in BUNDLED_METHODS:
        return f"the bundled engine does not run {method} speculative decoding"
    return None


def restrict(space: SearchSpace, deploy: str | None) -> SearchSpace:
    """`space` without the choices the deploy's engines cannot run: suffix for SGLang; for vLLM a DSpark head
    other than Markov (or DSpark itself, when the drafter's head is fixed to one vLLM lacks). One TunerError
    line when nothing runnable is left."""
    if deploy is None:
        return space
    want = engines(deploy)
    dists, fixed, warm = dict(space.distributions), dict(space.fixed), dict(space.warm_start)

    def value(name: str) -> Any:
        return fixed.get(name, space.defaults.get(name))

    def keep(name: str, ok, what: str) -> None:  # noqa: ANN001 - predicate on one choice
        d = dists.get(name)
        if d is None:
            if name in fixed and not ok(fixed[name]):
                raise TunerError(f"--deploy {deploy}: the plan fixes {name} = {fixed[name]}, which {what}; "
                                 f"choose --deploy {_other(want)}")
            return
        left = [c for c in d.choices if ok(c)]
        if not left:
            raise TunerError(f"--deploy {deploy}: every {name} the plan searches ({', '.join(map(str, d.choices))}) "
                             f"{what}; choose --deploy {_other(want)}")
        if len(left) == 1:
            del dists[name]
            fixed[name] = left[0]
        else:
            from optuna.distributions import CategoricalDistribution

            dists[name] = CategoricalDistribution(left)
        if name in warm and warm[name] not in left:
            del warm[name]

    def vllm_head(h: Any) -> bool:
        return why_not("vllm", {"spec.method": "dspark", "spec.head": h}) is None

    if deploy == "dspark":
        keep("spec.method", lambda m: why_not("dspark", {"spec.method": m}) is None, "the bundled engine cannot run")
    if "sglang" in want:
        keep("spec.method", lambda m: why_not("sglang", {"spec.method": m}) is None, "SGLang 0.5.23 cannot run")
    if "vllm" in want:
        keep("spec.method", lambda m: m in VLLM_METHODS or m == "plain", "vLLM 0.33 cannot run")
        head_choices = dists["spec.head"].choices if "spec.head" in dists else (value("spec.head"),)
        if any(vllm_head(h) for h in head_choices):
            keep("spec.head", vllm_head, "vLLM 0.33 cannot run (only the Markov DSpark head)")
        else:  # the drafter's head is one vLLM lacks: DSpark is out for this deploy
            keep("spec.method", lambda m: m != "dspark",
                 f"with the {head_choices[0]} head vLLM 0.33 cannot run (only the Markov DSpark head)")
    return SearchSpace(dists, fixed, space.defaults, warm, space.running_cap)


def _other(want: tuple[str, ...]) -> str:
    if not want:  # --deploy dspark
        return "both"
    return "sglang" if want == ("vllm",) else "vllm" if want == ("sglang",) else "sglang or --deploy vllm"
