"""Rich rendering of a Profile and of the catalogues (the `profile` command's human output)."""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table

from profiler.schema import Profile


def _n(x: float | None, unit: str = "") -> str:
    """1.23B / 456M / 7.8K style numbers."""
    if x is None:
        return "-"
    for div, suf in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suf}{unit}"
    return f"{x:.3g}{unit}"


def _gb(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x / 1e9:.1f} GB" if x >= 1e9 else f"{x / 1e6:.1f} MB"


def _kv(t: Table, k: str, v: str) -> None:
    t.add_row(f"[dim]{k}[/dim]", v)


def _table(title: str) -> Table:
    t = Table(title=title, show_header=False, box=None, title_justify="left", title_style="bold", pad_edge=False)
    t.add_column(style="dim", no_wrap=True)
    t.add_column()
    return t


def verdict(p: Profile) -> list[str]:
    """What bounds decode and what fits, in sentences."""
    d, m, hw = p.derived, p.model, p.hw
    out: list[str] = []
    if d.decode_bound and d.decode_batch is not None:
        tail = (f"; weight streaming alone stops bounding it at ~{d.ridge_batch:.0f} tokens per step "
                "(the verify-token budget before speculation costs compute)" if d.ridge_batch else "")
        out.append(f"Decode at batch {d.decode_batch} (context ~{d.decode_context:.0f}) is "
                   f"[bold]{d.decode_bound}-bound[/bold] on {hw.name}: {d.arith_intensity:.3g} FLOP/B vs ridge "
                   f"{d.ridge_intensity:.3g} FLOP/B, step ~{d.decode_step_ms:.3g} ms"
                   f"{f' at TP={d.min_tp_bf16}' if d.min_tp_bf16 and d.min_tp_bf16 > 1 else ''}{tail}.")
    elif d.arith_intensity is not None:
        how = ("profile with --gpu auto to time this CPU's rates" if hw and hw.arch == "cpu" else
               "give --gpu to compare with a ridge point")
        out.append(f"Decode at batch {d.decode_batch}: {d.arith_intensity:.3g} FLOP/B ({how}).")
    if d.min_tp_bf16 is not None or d.min_tp_fp8 is not None or hw.memory_gb:
        def tp(x: int | None) -> str:
            if hw and hw.arch == "cpu":
                return "fits" if x == 1 else "does not fit"
            return "does not fit in 64 GPUs" if x is None else ("1 GPU" if x == 1 else f"TP={x}")
        wb = m.weight_bytes
        out.append(f"Memory ({hw.memory_gb:g} GiB per device, weights + KV of {d.decode_batch} requests): "
                   f"bf16 {_gb(wb.bf16 if wb else None)} -> {tp(d.min_tp_bf16)}; "
                   f"fp8 {_gb(wb.fp8 if wb else None)} -> {tp(d.min_tp_fp8)}; "
                   f"int4 {_gb(wb.int4 if wb else None)} -> {tp(d.min_tp_int4)}.")
        if d.kv_capacity_tokens:
            out.append(f"KV capacity beside bf16 weights at TP={d.min_tp_bf16}: {_n(d.kv_capacity_tokens)} tokens.")
    return out


def render_profile(p: Profile, console: Console, profile_id: int | None = None) -> None:
    m, hw, w = p.model, p.hw, p.workload
    parts = []
    if m.name:
        t = _table(f"Model  {m.name}")
        arch = m.arch or "-"
        if m.arch == "moe":
            arch += f" ({m.num_experts} experts, top-{m.experts_per_token}, {m.num_moe_layers} MoE layers)"
        _kv(t, "family / arch", f"{m.family or '-'} / {arch}")
        _kv(t, "params", f"{_n(m.params_total)} total, {_n(m.params_active)} active")
        if m.num_layers:
            _kv(t, "shape", f"{m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} heads / {m.num_kv_heads} kv "
                            f"x {m.head_dim}, {(m.attention or '').upper()}, vocab {m.vocab_size}, "
                            f"context {m.max_context}")
        if m.weight_bytes:
            wb = m.weight_bytes
            _kv(t, "weights", f"bf16 {_gb(wb.bf16)}, fp8 {_gb(wb.fp8)}, int8 {_gb(wb.int8)}, int4 {_gb(wb.int4)}")
        if m.kv_bytes_per_token:
            kv = m.kv_bytes_per_token
            state = f"; + {_gb(m.kv_state_bytes)} bf16 state per request" if m.kv_state_bytes else ""
            linear = f" ({m.linear_attn_layers} layers without KV)" if m.linear_attn_layers else ""
            _kv(t, "KV / token", f"bf16 {kv.bf16 / 1024:.1f} KiB, fp8 {kv.fp8 / 1024:.1f} KiB{linear}{state}")
        if m.mtp_modules:
            _kv(t, "MTP", f"{m.mtp_modules} module(s) in the checkpoint (config.json num_nextn_predict_layers)")
        if m.flops_per_token:
            f = m.flops_per_token
            _kv(t, "FLOPs / token", f"prefill {_n(f.prefill)}, decode {_n(f.decode)} "
                                    f"(= {_n(f.linear)} + {_n(f.attn_per_ctx)} x context)")
        if m.ops:
            _kv(t, "op census", ", ".join(f"{k} {v}" for k, v in m.ops.items() if v) +
                f"  [dim]({m.census_source})[/dim]")
        _kv(t, "source", m.source or "-")
        parts.append(t)
    if hw.name:
        t = _table(f"Hardware  {hw.name}")
        pk = hw.peak_tflops
        _kv(t, "arch", f"{hw.arch} (sm {hw.sm}), {hw.num_sms or '-'} SMs/cores, L2 {hw.l2_mb or '-'} MB, "
                       f"{hw.interconnect}")
        _kv(t, "memory", f"{hw.memory_gb:g} GiB at {hw.bandwidth_gbs or '-'} GB/s" if hw.memory_gb else "unknown")
        if hw.cpu_capability:
            _kv(t, "CPU capability", f"{hw.cpu_capability} (AVX2 without AVX512-BF16: bf16 verification is "
                                     "compute-bound, the engine runs fp32 with oneDNN-packed weights)"
                if hw.cpu_capability == "AVX2" else hw.cpu_capability)
        if pk and pk.bf16:
            _kv(t, "dense peak", f"bf16 {pk.bf16:g}, fp8 {pk.fp8 if pk.fp8 else '-'}, int8 {pk.int8 or '-'} TFLOP/s")
        if hw.measured:
            ms = hw.measured
            _kv(t, "measured", f"bf16 {ms.tflops_bf16 or '-'}, fp16 {ms.tflops_fp16 or '-'}, "
                               f"fp32 {ms.tflops_fp32 or '-'} TFLOP/s; copy {ms.bandwidth_gbs or '-'} GB/s")
        parts.append(t)
    t = _table(f"Workload  {w.name}")
    pl, ol = w.prompt_len, w.output_len
    if pl and ol:
        _kv(t, "lengths", f"prompt mean {pl.mean:g} (p99 {pl.p99:g}), output mean {ol.mean:g} (p99 {ol.p99:g}) tokens")
    slo = [f"{k} {v:g} ms" for k, v in (("TTFT", w.slo.ttft_ms), ("TPOT", w.slo.tpot_ms)) if v] if w.slo else []
    _kv(t, "load", f"concurrency {w.concurrency}" + (f", {w.request_rate} req/s" if w.request_rate else "") +
        (f"; SLO p99 {', '.join(slo)}" if slo else "; no SLO"))
    _kv(t, "quality", "relaxed: 4-bit weights allowed" if w.quality == "relaxed"
        else "standard: 8-bit weights at most (--quality relaxed allows 4-bit)")
    if w.entropy:
        _kv(t, "entropy", f"mean {w.entropy.mean:.3f} nats, p90 {w.entropy.p90:.3f}")
    parts.append(t)
    dr, acc = p.drafter, p.accept
    if dr.id or dr.method or acc.tau:
        t = _table("Drafter")
        if dr.id:
            _kv(t, "checkpoint", f"{dr.id} (heads {', '.join(dr.heads or []) or '-'}, {dr.layers} layers, block "
                                 f"{dr.block_size}, rank {dr.markov_rank})")
        elif dr.method:
            facts = ", ".join(f"{k} {v}" for k, v in (("layers", dr.layers), ("block", dr.block_size),
                                                       ("vocab", dr.draft_vocab), ("modules", dr.mtp_modules),
                                                       ("draft", dr.draft_model), ("steps", dr.trained_steps))
                              if v is not None)
            _kv(t, "method", f"{dr.method}: {dr.checkpoint or 'no checkpoint'}" + (f" ({facts})" if facts else ""))
        if dr.available:
            _kv(t, "can run", ", ".join(dr.available))
        if acc.tau:
            pa = " ".join(f"{x:.2f}" for x in acc.position_acceptance or [])
            by_k = " ".join(f"K={k}: {v:g}" for k, v in (acc.tau_at_gamma or {}).items())
            more = f"; per position {pa}" if pa else (f"; {by_k}" if by_k else "")
            _kv(t, "acceptance", f"tau {acc.tau:.2f} at gamma {acc.gamma} on {acc.domain or '-'} ({acc.drafter}){more}")
            for head, table in (acc.per_head or {}).items():
                _kv(t, f"  {head}", " ".join(f"{x:.2f}" for x in table))
            _kv(t, "measured by" if (acc.source or "").startswith("measured") else "source", acc.source or "-")
        parts.append(t)
    lines = verdict(p)
    if lines:
        parts.append(Panel("\n".join(lines), title="Verdict", title_align="left"))
    if p.notes:
        parts.append("\n".join(f"[yellow]note:[/yellow] {n}" for n in p.notes))
    if profile_id is not None:
        parts.append(f"[green]stored as profile {profile_id}[/green]  (python cli.py match --profile-id {profile_id})")
    console.print(Group(*[x for part in parts for x in (part, "")]))


def models_table() -> Table:
    from profiler.arch import read_config
    from profiler.catalog import models
    from profiler.model import count_params

    t = Table(title="Model catalogue (profiler/catalog/models.yaml)")
    for col in ("name", "alias", "arch", "params", "active", "layers", "attn", "context"):
        t.add_column(col, no_wrap=col == "name",
                     justify="right" if col in ("params", "active", "layers", "context") else "left")
    for m in models():
        s = read_config(m.config, m.name)
        c = count_params(s)
        t.add_row(m.name, m.default_for or "", "moe" if s.is_moe else "dense", _n(c.total), _n(c.active),
                  str(s.num_layers), s.attention, str(s.max_context))
    return t


def gpus_table() -> Table:
    from profiler.catalog import gpus

    t = Table(title="GPU catalogue (profiler/catalog/gpus.yaml, dense peaks)")
    for col in ("name", "arch", "sm", "GB", "GB/s", "bf16 TF", "fp8 TF", "SMs", "link"):
        t.add_column(col, no_wrap=col == "name")
    for g in gpus():
        pk = g.peak_tflops
        t.add_row(g.name, g.arch, str(g.sm), f"{g.memory_gb:g}", f"{g.bandwidth_gbs or '-'}",
                  f"{pk.get('bf16') or '-'}", f"{pk.get('fp8') or '-'}", str(g.num_sms or "-"), g.interconnect)
    return t
