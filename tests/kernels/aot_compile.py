"""Compile every kernel ahead of time for real GPU targets (PTX + cubin via Triton's bundled ptxas), on a
machine without a GPU. The interpreter accepts code the compiler rejects (loop-carried type changes,
unsupported ops), so this is the CPU-side check that the kernels build for sm_80 / sm_90.

Run as a script in a process WITHOUT TRITON_INTERPRET (test_aot_compile.py does that):
    python tests/kernels/aot_compile.py [--arch 90] [--all-configs]
Prints one JSON line per compiled variant: kernel, arch, config, shared memory bytes, registers if known.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def variants(all_configs: bool) -> list[tuple[str, Any, dict[str, str], dict[str, Any], dict[str, int]]]:
    """(label, jit fn, signature, constexprs, launch options) for each kernel variant to build."""
    from dspark_core.kernels import markov_head, rmsnorm, swiglu, verify, verify_split

    out = []
    i32 = "i32"
    for greedy, dt in ((True, "fp32"), (True, "bf16"), (False, "fp32")):
        spec = verify.SPEC_GREEDY if greedy else verify.SPEC_SAMPLE
        sig = {"draft_ptr": "*i64", "num_ptr": "*i32", "tgt_ptr": f"*{dt}",
               "q_ptr": f"*{dt}" if greedy else "*fp32", "ua_ptr": "*i64" if greedy else "*fp32",
               "us_ptr": "*i64" if greedy else "*fp32", "acc_ptr": "*i32", "next_ptr": "*i64", "out_ptr": "*i64",
               "G": i32, "V": i32, "s_db": i32, "s_tb": i32, "s_tk": i32, "s_qb": i32, "s_qk": i32, "s_ub": i32,
               "GREEDY": "constexpr", "BLOCK_V": "constexpr", "BLOCK_G": "constexpr", "ROWS": "constexpr"}
        for cfg in _configs(spec, all_configs):
            const = {"GREEDY": greedy, "BLOCK_V": cfg["BLOCK_V"], "BLOCK_G": 16, "ROWS": cfg.get("ROWS", 1)}
            out.append((f"{spec.name}/{dt}", verify._verify_kernel, sig, const, cfg))
    for greedy in (True, False):  # the small-batch split variant: partials + finalize
        base = {"draft_ptr": "*i64", "num_ptr": "*i32", "tgt_ptr": "*fp32", "q_ptr": "*fp32",
                "ua_ptr": "*i64" if greedy else "*fp32"}
        ws = {"pv_ptr": "*fp32", "pi_ptr": "*i64" if greedy else "*fp32"}
        ints = {n: i32 for n in ("G", "V", "S", "CHUNK", "s_db", "s_tb", "s_tk", "s_qb", "s_qk", "s_ub")}
        tag = "verify_greedy" if greedy else "verify_sample"
        cfg = {"num_warps": 8, "num_stages": 2}
        sig = {**base, **ws, **ints, "GREEDY": "constexpr", "BLOCK_V": "constexpr"}
        out.append((f"{tag}/split-partial", verify_split._partial_kernel, sig, {"GREEDY": greedy, "BLOCK_V": 4096},
                    cfg))
        sig = {**base, "us_ptr": "*i64" if greedy else "*fp32", **ws, "acc_ptr": "*i32", "next_ptr": "*i64",
               "out_ptr": "*i64", **ints, "GREEDY": "constexpr", "BLOCK_V": "constexpr", "BLOCK_G": "constexpr",
               "BLOCK_S": "constexpr"}
        out.append((f"{tag}/split-finalize", verify_split._finalize_kernel, sig,
                    {"GREEDY": greedy, "BLOCK_V": 4096, "BLOCK_G": 16, "BLOCK_S": 32}, cfg))
    for cfg in _configs(rmsnorm.SPEC, all_configs):
        for has_res, one_pass in ((True, cfg["BLOCK_H"] == 0), (False, cfg["BLOCK_H"] == 0)):
            sig = {"x_ptr": "*bf16", "r_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "res_out_ptr": "*bf16",
                   "H": i32, "s_x": i32, "s_r": i32, "s_o": i32, "s_ro": i32, "eps": "fp32",
                   "HAS_RES": "constexpr", "BLOCK_H": "constexpr", "ONE_PASS": "constexpr"}
            block = 4096 if cfg["BLOCK_H"] == 0 else cfg["BLOCK_H"]
            const = {"HAS_RES": has_res, "BLOCK_H": block, "ONE_PASS": one_pass}
            out.append((f"rmsnorm/res={has_res}", rmsnorm._rmsnorm_kernel, sig, const, cfg))
    for cfg in _configs(swiglu.SPEC, all_configs):
        sig = {"g_ptr": "*bf16", "u_ptr": "*bf16", "o_ptr": "*bf16", "n_inter": i32, "s_g": i32, "s_u": i32,
               "s_o": i32, "BLOCK": "constexpr"}
        out.append(("swiglu", swiglu._swiglu_kernel, sig, {"BLOCK": cfg["BLOCK"]}, cfg))
    for cfg in _configs(markov_head.SPEC, all_configs):
        for greedy, wdt in ((True, "bf16"), (False, "bf16"), (False, "fp32")):
            sig = {"base_ptr": "*fp32", "xp_ptr": "*i64", "w1_ptr": f"*{wdt}", "w2_ptr": f"*{wdt}",
                   "t_ptr": "*fp32", "u_ptr": "*fp32", "z_ptr": "*fp32", "pmax_ptr": "*fp32", "pidx_ptr": "*i64",
                   "B": i32, "V": i32, "R": i32, "NV": i32, "s_base": i32, "s_w1": i32, "s_w2": i32, "s_u": i32,
                   "s_z": i32, "GREEDY": "constexpr", "HAS_T": "constexpr", "WRITE_Z": "constexpr",
                   "IEEE": "constexpr", "UPCAST": "constexpr", "BLOCK_B": "constexpr", "BLOCK_V": "constexpr",
                   "BLOCK_R": "constexpr"}
            const = {"GREEDY": greedy, "HAS_T": True, "WRITE_Z": not greedy, "IEEE": wdt == "fp32", "UPCAST": False,
                     "BLOCK_B": cfg["BLOCK_B"], "BLOCK_V": cfg["BLOCK_V"], "BLOCK_R": cfg["BLOCK_R"]}
            out.append((f"markov_head/{'greedy' if greedy else 'sample'}/{wdt}", markov_head._markov_tile_kernel,
                        sig, const, cfg))
    sig = {"pmax_ptr": "*fp32", "pidx_ptr": "*i64", "tok_ptr": "*i64", "NV": i32, "BLOCK_N": "constexpr"}
    out.append(("markov_head/reduce", markov_head._markov_reduce_kernel, sig, {"BLOCK_N": 1024},
                {"num_warps": 4, "num_stages": 1}))
    return out


def _configs(spec: Any, all_configs: bool) -> list[dict[str, int]]:
    """Every arch default, plus (with all_configs) every point of the space."""
    seen, out = set(), []
    pool = list(spec.defaults.values())
    if all_configs:
        knobs = list(spec.space)
        pool += [dict(zip(knobs, vals, strict=True)) for vals in itertools.product(*spec.space.values())]
    for cfg in pool:
        key = tuple(sorted(cfg.items()))
        if key not in seen:
            seen.add(key)
            out.append(dict(cfg))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, action="append", help="compute capability x10 (default 80 and 90)")
    ap.add_argument("--all-configs", action="store_true", help="every point of every space (slow)")
    ap.add_argument("--only", default="", help="substring filter on the variant label")
    ap.add_argument("--quick", action="store_true", help="one config per variant label (the first default)")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET"):
        print("unset TRITON_INTERPRET: this script compiles for real GPUs", file=sys.stderr)
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    failed = 0
    for arch in args.arch or [80, 90]:
        done: set[str] = set()
        for label, fn, sig, const, cfg in variants(args.all_configs):
            if (args.only and args.only not in label) or (args.quick and label in done):
                continue
            done.add(label)
            opts = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
            try:
                k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const),
                                   target=GPUTarget("cuda", arch, 32), options=opts)
                shared = int(getattr(k.metadata, "shared", 0))
                print(json.dumps({"kernel": label, "arch": arch, "config": cfg, "shared": shared, "ok": True}))
            except Exception as e:  # report every failure, then fail the run
                failed += 1
                msg = str(e).strip().splitlines()
                print(json.dumps({"kernel": label, "arch": arch, "config": cfg, "ok": False,
                                  "error": f"{type(e).__name__}: {msg[-1] if msg else ''}"[:400]}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
