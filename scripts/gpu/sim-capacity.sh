#!/usr/bin/env bash
# Simulated capacity sweeps on the GPU host's 16 CPU cores (the simulator needs no GPU): the 2-core development
# machine adds its own process time, x sim.speed, to every router and client hop, which the P/D legs pay more
# of than the aggregated one. Every number these runs produce is simulated.
#
#   bash scripts/gpu/sim-capacity.sh stash                 # a call carrying part of .gpu/simwh: keep those wheels
#   bash scripts/gpu/sim-capacity.sh setup                 # venv with pdctl's dependencies from /root/simwh
#   bash scripts/gpu/sim-capacity.sh sweeps OUT FILE       # each line of FILE: capacity_sweep.py arguments, all
#                                                          # lines at once (one process each), logs in OUT/,
#                                                          # results in OUT.tgz
# .gpu/simwh comes from `pip download --python-version 3.12 --only-binary=:all: ...` of pyproject's dependencies
# (scripts/capacity_sweep.py takes its ports and process helpers from tests/support; pytest is not needed).
set -euo pipefail
cd "$(dirname "$0")/../.."
WH=${SIMWH:-/root/simwh}
VENV=${SIMVENV:-/root/simvenv}
case "${1:-}" in
  stash)
    mkdir -p "$WH" && cp .gpu/simwh/*/*.whl "$WH"/ && ls "$WH" | wc -l ;;
  setup)
    mkdir -p "$WH" && { cp .gpu/simwh/*/*.whl "$WH"/ 2>/dev/null || true; }
    py=$(command -v python3.12 || echo /opt/torch/.venv/bin/python)
    "$py" -m venv "$VENV"
    "$VENV"/bin/pip install -q --no-index --find-links "$WH" typer rich pyyaml pydantic paramiko httpx starlette \
      uvicorn prometheus-client httptools uvloop orjson packaging matplotlib
    PYTHONPATH=$PWD "$VENV"/bin/python -c "import pdctl, matplotlib, uvloop; print('pdctl', pdctl.__version__ if hasattr(pdctl, '__version__') else '?')" ;;
  sweeps)
    out=$2 spec=$3 i=0
    mkdir -p "$out"
    nproc; uptime
    while IFS= read -r line; do
      [[ -z "$line" || "$line" == \#* ]] && continue
      i=$((i + 1))
      echo "[$i] capacity_sweep.py $line" | tee "$out/$i.log"
      # shellcheck disable=SC2086
      PYTHONPATH=$PWD timeout "${LINE_TIMEOUT:-560}" "$VENV"/bin/python scripts/capacity_sweep.py $line --tag "s$i" --port-base $((20000 + 400 * i)) --out "$out/$i" >>"$out/$i.log" 2>&1 &
    done <"$spec"
    fails=0
    for job in $(jobs -p); do wait "$job" || fails=$((fails + 1)); done
    uptime
    for f in "$out"/*.log; do echo "== $f"; tail -25 "$f"; done
    # what comes back from the device may be at most a few folders deep: one archive, without the per-request
    # records (report.md, legs.json, summary.csv and the plots stay)
    tar -C "$out" -czf "$out.tgz" --exclude 'requests.json*' . && ls -la "$out.tgz"
    exit "$fails" ;;
  *) echo "usage: $0 stash|setup|sweeps OUT FILE" >&2; exit 2 ;;
esac
