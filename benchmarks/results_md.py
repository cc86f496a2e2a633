"""Shared by the benchmark scripts: the bench JSON as a markdown table, and replacing one marked
section of RESULTS.md (written atomically, other sections untouched)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
sys.path.insert(0, str(ROOT))

from dspark_core.atomic import atomic_write_text  # noqa: E402


def check_ranges(script: str, checks: tuple[tuple[str, float, float, float], ...]) -> None:
    """Exit 2 with one line for the first option outside its range: each check is (option, value, low, high),
    both bounds included. Benchmarks size their loops and allocations from these."""
    for name, value, low, high in checks:
        if not low <= value <= high:
            print(f"{script}: {name} {value} is outside [{low}, {high}]", file=sys.stderr)
            raise SystemExit(2)


def shown_command(script: str) -> str:
    """The command line this run was started with (`python SCRIPT ARGS`), quoted for a shell: what reruns it."""
    return shlex.join(["python", script, *sys.argv[1:]])


def bench_table(result: dict) -> str:
    """Markdown table of `python cli.py bench --json` output."""
    ident = any("identical_share" in m for m in result["methods"])
    decode = any(m.get("decode_speedup") for m in result["methods"])
    head = "| method | tokens/s | speedup vs plain |" + (" decode speedup (prefill left out) |" if decode else "")
    head += " tau | per-position acceptance | lossless |"
    rule = "|---|---:|---:|" + ("---:|" if decode else "") + "---:|---|---|"
    if ident:
        head += " identical to plain | first divergence: prompt, token, target top-2 margin |"
        rule += "---:|---|"
    lines = [head, rule]
    for m in result["methods"]:
        acc = " ".join(f"{x:.2f}" for x in m["position_acceptance"]) or "-"
        tau = f"{m['tau']:.2f}" if m["tau"] else "-"
        loss = {True: "yes", False: "no", None: "-"}[m["lossless"]]
        row = f"| {m['name']} | {m['tokens_per_s']:.1f} | {m['speedup']:.2f}x |"
        if decode:
            row += f" {m['decode_speedup']:.2f}x |" if m.get("decode_speedup") else " - |"
        row += f" {tau} | {acc} | {loss} |"
        if ident:
            share, div = m.get("identical_share"), m.get("first_divergence")
            row += f" {share:.0%} |" if share is not None else " - |"
            row += f" {div['prompt']}, {div['position']}, {div['top2_margin']:.3f} |" if div else " - |"
        lines.append(row)
    return "\n".join(lines)


def write_section(name: str, text: str, path: Path = RESULTS) -> None:
    """Replace (or append) the `<!-- name:start -->` ... `<!-- name:end -->` section of RESULTS.md."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    old = path.read_text() if path.exists() else "# Benchmark results\n"
    block = f"{start}\n{text}\n{end}"
    if start in old and end in old:
        new = old[: old.index(start)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    atomic_write_text(path, new)
