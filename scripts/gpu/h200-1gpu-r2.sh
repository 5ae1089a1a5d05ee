#!/usr/bin/env bash
# Issue 29 item 4: the one-H200 re-run (configs/h200-1gpu.yaml) of agg / OFF (prefill caching on and off) /
# ON via the prefill / ON default, with the KV moved per warm turn beside each (docs/results/h200-1gpu-r2).
# Built on scripts/gpu/h200-1gpu.sh (receive/setup stages as in docs/gpu-run.md "One H200"), one stage per device call:
#
#   h200-1gpu-r2.sh receive         move the carried wheelhouse part(s) (./.gpu/wh/p*/) to /root/pdctl-gpu/parts;
#                                   the first call also writes the device facts
#   h200-1gpu-r2.sh go SECONDS      once: receive the last part, `setup` from the carried .gpu/src (git archive of the
#                                   commit measured); then bench A (3 legs) in the background, then bench B (2 legs),
#                                   waiting up to SECONDS in all; repeat `go` until both are done. Each finished
#                                   bench's report, records and engine logs come back in every later call's $OUT.
#
# PDCTL_GPU_RUN=r3 (docs/results/h200-1gpu-r3): after issue 29's own-cache check, one bench of the three legs that
# check can change (on-prefill, off, on), nothing else.
set -uo pipefail
base=/root/pdctl-gpu
repo=$base/src
out=${OUT:-$PWD/gpu-out}
mkdir -p "$base/parts" "$base/saved" "$out"
export PDCTL_HOME=$base/home PYTHONUNBUFFERED=1 COLUMNS=160
cli=/opt/torch/.venv/bin/pdctl
topo=$repo/configs/h200-1gpu.yaml
sets=(--set "python.wheelhouse=$base/wh/wheels")
common=(--api completions --lengths 2000,8000,16000,24000 --conversations 2 --turns 3 --user-tokens 512
        --output-tokens 64 --clients 1)
legs_a=(--leg "on-prefill:connector.bidirectional_kv_xfer=true,router.local_prefill_tokens=0"
        --leg "off:connector.bidirectional_kv_xfer=false"
        --leg "off-nocache:connector.bidirectional_kv_xfer=false,prefill[0].prefix_caching=false")
legs_b=(--leg "on:connector.bidirectional_kv_xfer=true"
        --leg "agg:mode=aggregated,model.gpu_memory_utilization=0.9")
benches="a b"
if [ "${PDCTL_GPU_RUN:-r2}" = r3 ]; then
  legs_a=("${legs_a[@]:0:4}" --leg "on:connector.bidirectional_kv_xfer=true")
  benches="a"
fi

. "$(dirname "$0")/lib.sh"

receive() {
  for p in "$PWD"/.gpu/wh/p*/part* "$PWD"/.gpu/wh/p*/SHA256SUMS; do [ -e "$p" ] && mv "$p" "$base/parts/"; done
  ls -l "$base/parts"
}

facts() {
  { date -u; uname -a; nproc; free -g | head -2
    nvidia-smi
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv
    nvidia-smi topo -m
    /opt/torch/.venv/bin/python -c 'import torch, sys; print(sys.version); print(torch.__version__, torch.version.cuda)'
  } > "$base/saved/device.txt" 2>&1
}

start_bench() {  # start_bench NAME LEGS...
  local name=$1; shift
  rm -rf "$base/bench-$name"
  setsid nohup "$cli" bench -t "$topo" "${sets[@]}" --out "$base/bench-$name" "${common[@]}" "$@" \
    >"$base/bench-$name.log" 2>&1 &
  echo $! > "$base/bench-$name.pid"
  echo "bench $name started, pid $! ($(date -u +%T))"
}

save() {  # save NAME: the bench's report dir, its log and every engine/router log line about KV transfer
  local name=$1
  grep -a -H "KV Transfer metrics" /root/.pdctl/h200-1gpu/logs/*.log > "$base/bench-$name/kvmetrics-logs.txt" 2>/dev/null
  cp "$base/bench-$name.log" "$base/bench-$name/bench.log"
  tar -C "$base" -czf "$base/saved/bench-$name.tgz" "bench-$name"
  tar -C /root/.pdctl/h200-1gpu -czf "$base/saved/logs-$name.tgz" logs 2>/dev/null
  touch "$base/bench-$name.saved"
}

stage=${1:?stage}; shift
case $stage in
  receive)
    receive
    [ -e "$base/saved/device.txt" ] || facts
    cp "$base/saved/device.txt" "$out/"
    ;;
  go)
    deadline=$((SECONDS + ${1:-560}))
    if [ ! -e "$base/setup.done" ]; then
      receive
      echo "commit measured: $(cat "$PWD/.gpu/src/COMMIT")"
      bash "$PWD/.gpu/src/scripts/gpu/h200-1gpu.sh" setup > "$base/saved/setup.txt" 2>&1 || {
        cp "$base/saved/setup.txt" "$out/"; tail -40 "$base/saved/setup.txt"; exit 1; }
      cp "$out/doctor.txt" "$base/saved/" 2>/dev/null
      cp "$PWD/.gpu/src/COMMIT" "$base/saved/"
      touch "$base/setup.done"; tail -15 "$base/saved/setup.txt"
    fi
    # shellcheck disable=SC2086  # $benches: the names, split
    run_benches "$deadline" 25 $benches
    cp "$base/saved/setup.txt" "$out/" 2>/dev/null
    send_saved
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
