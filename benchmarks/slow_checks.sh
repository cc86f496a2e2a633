#!/usr/bin/env bash
# The tests marked `slow` (a minute or more each), which the README's suite skips to stay within 15 minutes:
# run them before resolving an issue that touches what they cover.  Usage: bash benchmarks/slow_checks.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
DSPARK_SLOW_CHECKS=1 exec python -m pytest -m slow "$@"
