#!/usr/bin/env bash
# The router's CPU per request on the GPU host's CPU cores (16, nothing else running), in one device call:
# scripts/router_cpu_bench.py from each carried source tree in turn, interleaved by leg set, the router pinned to its
# own core. No GPU is used; the point is a quiet host with cores to spare (the development machine has 2, shared).
#
#   router-cpu.sh BUNDLE NAME=SRC [NAME=SRC ...]
#
# BUNDLE/wheels holds pdctl's dependencies as wheels for the host's Python (no matplotlib: the router, the simulator
# and the bench do not import it; no pytest: the bench takes its port and process helpers from tests/support). Or
# set PDCTL_RCPU_VENV to a venv that has them (after the GPU runs' `setup`: /opt/torch/.venv) and BUNDLE is not read.
# Each SRC is `git archive HEAD pdctl scripts pyproject.toml tests/__init__.py tests/support` at the commit to
# measure, with its commit in SRC/COMMIT.
# $PDCTL_RCPU_ARGS: the bench's options (default: 64,256,1000 streams, new + mix, 3 reps of 4 s); $PDCTL_RCPU_SMALL:
# options of a second run with the decode's KV made small (default: 256 streams, 3000 blocks; "" to skip).
# Writes $OUT/NAME.json, $OUT/NAME-small.json and $OUT/NAME.txt (the printed tables), with `uptime` around each.
set -euo pipefail
bundle=${1:?bundle}; shift
out=${OUT:-$PWD/rcpu-out}
py=${PDCTL_RCPU_PYTHON:-python3}
venv=${PDCTL_RCPU_VENV:-/tmp/pdctl-rcpu-venv}
args=${PDCTL_RCPU_ARGS:---seconds 4 --base-port 21000}  # below the ephemeral range: no outgoing connection holds them
small=${PDCTL_RCPU_SMALL---streams 256 --decode-blocks 3000 --seconds 4 --base-port 21500}
mkdir -p "$out"

if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --no-index --find-links "$bundle/wheels" "$bundle"/wheels/*.whl
fi
{ nproc; "$venv/bin/python" --version; grep -m1 "model name" /proc/cpuinfo || true; } > "$out/host.txt"

for spec in "$@"; do
  name=${spec%%=*} src=${spec#*=}
  echo "== $name ($(cat "$src/COMMIT" 2>/dev/null || echo "?")) $(date -u +%T)"
  { echo "commit $(cat "$src/COMMIT" 2>/dev/null || echo "?")"; echo "uptime before: $(uptime)"; } > "$out/$name.txt"
  # shellcheck disable=SC2086  # the options, split
  (cd "$src" && PYTHONPATH="$src" "$venv/bin/python" scripts/router_cpu_bench.py $args --json "$out/$name.json") \
    >> "$out/$name.txt" 2>&1 || echo "bench $name failed: $(tail -3 "$out/$name.txt")"
  if [ -n "$small" ]; then
    # shellcheck disable=SC2086
    (cd "$src" && PYTHONPATH="$src" "$venv/bin/python" scripts/router_cpu_bench.py $small --json "$out/$name-small.json") \
      >> "$out/$name.txt" 2>&1 || echo "small-KV bench $name failed: $(tail -3 "$out/$name.txt")"
  fi
  echo "uptime after: $(uptime)" >> "$out/$name.txt"
  grep -E "ON/OFF|uptime" "$out/$name.txt" | tail -12
done
