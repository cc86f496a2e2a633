"""The launch scripts of a planned deployment (tuner/templates/cluster/), beside the tuned server's own.

Each is a thin wrapper over sglang.sh / vllm.sh, so every replica and worker starts with exactly the tuned flags,
plus what the layout adds: its port and GPUs, and
- aggregated: cluster_sglang.sh starts a node's replicas and, on node 0, SGLang's router over all of them;
  cluster_vllm.sh hands the replicas to vLLM's own data parallelism (--data-parallel-size, multi-node flags), or
  starts one server per replica where vLLM's data parallelism would change the tuned configuration;
- disaggregated: sglang_prefill.sh / sglang_decode.sh (--disaggregation-mode, transfer backend) and
  sglang_router.sh (the router's --pd-disaggregation); vllm_prefill.sh / vllm_decode.sh (--kv-transfer-config).
A prefill worker of another TP than the tuned (decode) server's (dense models only: the planner pairs a MoE model's
workers at one TP, whose tuned expert / attention-DP layout the prefill then shares) repeats the TP option after
the script's own, with vLLM's data parallelism 1: both engines' parsers keep an option's last value (the interop
check runs them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.cluster import Layout
from tuner.launch import _script, template_env
from tuner.script_values import check_values

SGLANG_PORT = 30000  # SGLang's default port, the scripts' default first port
VLLM_PORT = 8000  # vLLM's default port
VLLM_PD_CONNECTOR = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'  # vLLM's P/D KV transfer over NIXL


def write_scripts(folder: Path, lay: Layout, choice: Any, engines: tuple[str, ...], vllm_dp: bool, spec_on: bool,
                  common: dict[str, Any]) -> list[str]:
    """The deployment's scripts for `engines` into `folder` (which holds the tuned sglang.sh / vllm.sh); their
    names. `choice`: tuner.cluster_tune.ClusterChoice; `vllm_dp`: aggregated vLLM replicas may be vLLM's own data
    parallelism (false when the tuned server already runs several replicas, or runs a per-batch-size draft schedule,
    which vLLM 0.33 drops under data parallelism: then one server per replica); `spec_on`: the tuned server
    speculates."""
    env = template_env()
    made: list[str] = []

    def put(name: str, template: str, **ctx: Any) -> None:
        check_values(name, {**common, **ctx})
        _script(folder, name, env.get_template(f"cluster/{template}").render(**common, **ctx))
        made.append(name)

    size = {"gpus": choice.gpus, "nodes": choice.nodes, "per_node": choice.per_node}
    if lay.mode == "agg":
        per_node = choice.per_node // lay.tp
        agg = {**size, "tp": lay.tp, "replicas": lay.replicas, "replicas_per_node": per_node}
        if "sglang" in engines:
            put("cluster_sglang.sh", "sglang_agg.sh.j2", port=SGLANG_PORT, **agg)
        if "vllm" in engines:
            put("cluster_vllm.sh", "vllm_agg.sh.j2" if vllm_dp else "vllm_replicas.sh.j2", port=VLLM_PORT, **agg)
        return made
    roles = (("prefill", lay.prefill_tp, lay.prefill_workers, lay.decode_tp),
             ("decode", lay.decode_tp, lay.decode_workers, lay.prefill_tp))
    if "sglang" in engines:
        for role, tp, n, other in roles:
            put(f"sglang_{role}.sh", "sglang_pd.sh.j2", role=role, tp=tp, other_tp=other, workers=n, port=SGLANG_PORT,
                prefill_tokens=lay.prefill_batch * choice.isl, spec_enabled=spec_on)
        put("sglang_router.sh", "sglang_pd_router.sh.j2", prefill_workers=lay.prefill_workers,
            decode_workers=lay.decode_workers)
    if "vllm" in engines:
        for role, tp, n, other in roles:
            put(f"vllm_{role}.sh", "vllm_pd.sh.j2", role=role, tp=tp, other_tp=other, workers=n, port=VLLM_PORT,
                connector=VLLM_PD_CONNECTOR)
    return made

