"""Write held-out code prompts from installed third-party packages (never the standard library).

The tiny models are trained on the standard library only, so code from site-packages is unseen text.
Each prompt is the source leading up to (and including) a `def` line, so the model continues a body.
Deterministic: sorted files, a fixed stride. Usage: python benchmarks/make_heldout_prompts.py [--n 32]
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

from dspark_core.training.code_sources import BENCH_PACKAGES as PACKAGES  # the drafters never train on them


def prompts(n: int, max_chars: int = 700) -> list[dict[str, str]]:
    """Up to `n` prompts, round-robin over PACKAGES."""
    site = Path(sysconfig.get_paths()["purelib"])
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    per_pkg: list[list[dict[str, str]]] = []
    for pkg in PACKAGES:
        root = site / pkg
        if not root.is_dir() or stdlib in root.resolve().parents:
            continue
        found: list[dict[str, str]] = []
        for f in sorted(root.rglob("*.py"))[::3]:
            lines = f.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
            defs = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("def ") and ln.rstrip().endswith(":")]
            if len(defs) < 2:
                continue
            i = defs[len(defs) // 2]
            text = "".join(lines[max(0, i - 30) : i + 1])[-max_chars:]
            found.append({"prompt": text, "domain": "code", "source": f"{pkg}/{f.relative_to(root)}"})
        per_pkg.append(found)
    out: list[dict[str, str]] = []
    k = 0
    while len(out) < n and any(k < len(p) for p in per_pkg):
        out.extend(p[k] for p in per_pkg if k < len(p))
        k += 1
    return out[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=32, help="number of prompts")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "prompts" / "heldout_code.jsonl")
    args = ap.parse_args()
    rows = prompts(args.n)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {args.out}")


if __name__ == "__main__":
    main()
