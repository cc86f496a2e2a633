"""Stand-in for `python -m sglang_router.launch_router` when the cluster interop check runs a bundle's router script.

Runs in the peer venv (sglang-router 0.3.2). Parses the command line exactly as the script built it with the
router's own parser (`parse_router_args`, which also validates it: PD mode needs prefill and decode URLs, and so
on), and prints one JSON object: the mode and the workers it would route to. Exit 0 only when the router accepted it.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    from sglang_router.launch_router import parse_router_args

    out: dict = {"argv": argv, "tool": "sglang_router"}
    try:
        ra = parse_router_args(argv)
    except SystemExit as e:
        out["error"] = f"the router's parser refused the command line (exit {e.code})"
    except Exception as e:  # noqa: BLE001 - report whatever the router raises
        out["error"] = f"{type(e).__name__}: {e}"
    else:
        out["resolved"] = {"pd_disaggregation": ra.pd_disaggregation, "worker_urls": list(ra.worker_urls or []),
                           "prefill_urls": [list(p) if isinstance(p, tuple) else p for p in ra.prefill_urls or []],
                           "decode_urls": list(ra.decode_urls or []), "host": ra.host, "port": ra.port}
    out["ok"] = "error" not in out
    print(json.dumps(out, default=str))
    return 0 if out["ok"] else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
