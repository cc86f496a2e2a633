"""What `tune` prints when it has exported a bundle (tuner/commands_tune.py); `--json` prints the summary instead."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from kb.cli_common import console


def print_summary(s: dict[str, Any]) -> None:
    """The lines `tune` prints after exporting: the study, the exported configuration's figures and settings, the
    planned deployment (`--serving`), the bundle's files and the simulator's calibration."""
    mode = "SIMULATED" if s["mode"] == "simulate" else "MEASURED"
    console.print(f"[bold]{mode}[/] study {escape(s['study'])}: {s['trials']} trials, exported trial {s['trial']} "
                  f"{'(meets the SLOs)' if s['meets_slo'] else '[red](no trial met the SLOs)[/]'}")
    m = s["metrics"]
    if m:
        console.print(f"  throughput {m.get('throughput', 0):,.0f} tok/s/GPU, "
                      f"p99 TPOT {m.get('tpot_p99_ms', 0):.2f} ms, "
                      f"p99 TTFT {m.get('ttft_p99_ms', 0):.0f} ms, tau {m.get('tau', 0):.2f}")
    p = s["params"]
    method = p.get("spec.method", "dspark") if p.get("spec.enabled", True) else "none"
    console.print(f"  method {method}, gamma {p['spec.block_size']}, head {p['spec.head']}, "
                  f"scheduler {p['spec.scheduler']}, "
                  f"max requests {p['batch.max_requests']}, weights {p['weights.dtype']}, kv {p['kv.dtype']}, "
                  f"tp {p['parallel.tp']}")
    if s.get("cluster"):
        from tuner.cluster import Layout

        c = s["cluster"]
        console.print(f"  deployment: {escape(Layout(**c['chosen']).describe())} (its decoding server as tuned, "
                      f"speculation {c['speculation_speedup']:.2f}x; cluster.json, report.md)", highlight=False)
    console.print(f"  bundle: {escape(str(s['out']))}/ ({', '.join(s['files'])})")
    if s.get("calibration"):
        c = s["calibration"]
        how = "efficiencies refitted, " if c.get("efficiency") else ""
        console.print(f"  simulator calibrated on {c['trials']:.0f} trials ({how}residual scale x{c['scale']:.3g}; "
                      f"measured / predicted spread x{c['spread_before']:.2f} -> x{c['spread']:.2f}); later studies "
                      "of this hardware simulate with it")
        if c.get("at_grid_edge"):
            console.print(f"  note: {', '.join(c['at_grid_edge'])} at the top of the calibration grid (the machine may "
                          "be slower still there)", highlight=False)
    if s.get("isolation"):
        from tuner.live.isolate import isolation_text

        console.print(f"  {isolation_text(s['isolation'])}", highlight=False)
