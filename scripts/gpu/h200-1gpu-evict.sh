#!/usr/bin/env bash
# One GPU under eviction (docs/results/h100-1gpu-evict: run on an H100 at sessions 8,16, one run per point): configs/h200-1gpu-evict.yaml (prefill and decode share
# GPU 0, the prefill's KV cut to 192 blocks), `pdctl bench --profile agent --sweep` over agent sessions, legs OFF
# (one-way, the prefill's prefix caching on), ON via the prefill, ON default; then the aggregated engine alone.
# One stage per device call (docs/gpu-run.md "One H200"):
#
#   h200-1gpu-evict.sh receive        move the carried wheelhouse part (./.gpu/wh/parts/partNN) out of the tree
#   h200-1gpu-evict.sh setup          once: `setup` (scripts/gpu/h200-1gpu.sh) from the carried .gpu/src
#   h200-1gpu-evict.sh restart        (after setup) a router-only restart under load: scripts/gpu/restart_check.py
#                                     on a fresh ON deployment ($PDCTL_RESTART_ARGS: its load options), then down
#   h200-1gpu-evict.sh go SECONDS     once: `setup` (scripts/gpu/h200-1gpu.sh) from the carried .gpu/src; then
#                                     bench A (off, on-prefill, on) in the background, then bench B (agg), waiting
#                                     up to SECONDS in all; repeat `go` until both are saved. Every call returns
#                                     what is saved so far.
set -uo pipefail
base=/root/pdctl-gpu
repo=$base/src
out=${OUT:-$PWD/gpu-out}
mkdir -p "$base/parts" "$base/saved" "$out"
export PDCTL_HOME=$base/home PYTHONUNBUFFERED=1 COLUMNS=160
cli=/opt/torch/.venv/bin/pdctl
topo=$repo/configs/h200-1gpu-evict.yaml
sweep=${PDCTL_EVICT_SWEEP:-sessions=4,8,16}
benches=${PDCTL_EVICT_BENCHES:-a b}  # a: off, on-prefill, on; b: the aggregated engine alone; c: off, on, on-itl;
                                     # d: on-itl, off; e: off, on, on-384; f: on; g: off, on
runs=${PDCTL_EVICT_RUNS:-2}          # plays per session count (1 when the device time allows no more)
common=(--set "python.wheelhouse=$base/wh/wheels" --profile agent --sweep "$sweep" --slo ttft_p90=500,itl_p99=200
        --runs "$runs")
legs_a=(--leg "off:connector.bidirectional_kv_xfer=false"
        --leg "on-prefill:connector.bidirectional_kv_xfer=true,router.local_prefill_tokens=0"
        --leg "on:connector.bidirectional_kv_xfer=true")
legs_b=(--leg "agg:mode=aggregated,model.gpu_memory_utilization=0.9")
# c: ON default against ON with local turns bounded by the ITL budget alone (router.local_stall_ratio=0: a warm turn
# may run on the decode alone whenever its stall keeps the other streams' gaps within the budget)
legs_c=(--leg "off:connector.bidirectional_kv_xfer=false"
        --leg "on:connector.bidirectional_kv_xfer=true"
        --leg "on-itl:connector.bidirectional_kv_xfer=true,router.local_stall_ratio=0")
legs_d=(--leg "on-itl:connector.bidirectional_kv_xfer=true,router.local_stall_ratio=0"
        --leg "off:connector.bidirectional_kv_xfer=false")
# e: ON default with the decode's token budget at the config's 512 and at 384 (smaller chunks: a smaller stall a
# step against the streams' largest gap, a step more per chunk in a local turn's TTFT)
legs_e=(--leg "off:connector.bidirectional_kv_xfer=false"
        --leg "on:connector.bidirectional_kv_xfer=true"
        --leg "on-384:connector.bidirectional_kv_xfer=true,decode[0].model.max_num_batched_tokens=384")
# f: ON default alone (a check of a router change where the device time allows one leg; compare it with an OFF
# leg measured on the same card only)
legs_f=(--leg "on:connector.bidirectional_kv_xfer=true")
# g: OFF and ON default alone, on the same card (a sweep of three session counts in the time of e's two: the largest
# count both hold, where OFF holds the smallest only)
legs_g=(--leg "off:connector.bidirectional_kv_xfer=false"
        --leg "on:connector.bidirectional_kv_xfer=true")

. "$(dirname "$0")/lib.sh"

start_bench() {  # start_bench NAME LEGS...
  local name=$1; shift
  rm -rf "$base/bench-$name"
  setsid nohup "$cli" bench -t "$topo" "${common[@]}" --out "$base/bench-$name" "$@" >"$base/bench-$name.log" 2>&1 &
  echo $! > "$base/bench-$name.pid"
  echo "bench $name started, pid $! ($(date -u +%T))"
}

save() {  # the bench's report dir and log, the engines' KV-transfer log lines, all logs
  local name=$1 logs
  logs=$(find "$PDCTL_HOME" /root/.pdctl -path '*h200-1gpu-evict/logs' -type d 2>/dev/null | head -1)
  mkdir -p "$base/bench-$name"
  [ -n "$logs" ] && grep -a -H "KV Transfer metrics" "$logs"/*.log > "$base/bench-$name/kvmetrics-logs.txt" 2>/dev/null
  cp "$base/bench-$name.log" "$base/bench-$name/bench.log"
  tar -C "$base" -czf "$base/saved/bench-$name.tgz" "bench-$name"
  [ -n "$logs" ] && tar -C "$logs/.." -czf "$base/saved/logs-$name.tgz" logs
  touch "$base/bench-$name.saved"
}

ensure_setup() {  # once: setup (scripts/gpu/h200-1gpu.sh) from the carried .gpu/src
  [ -e "$base/setup.done" ] && return 0
  for p in "$PWD"/.gpu/wh/parts/part* "$PWD"/.gpu/wh/parts/SHA256SUMS; do [ -e "$p" ] && mv "$p" "$base/parts/"; done
  echo "commit measured: $(cat "$PWD/.gpu/src/COMMIT")"
  { date -u; nproc; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } > "$base/saved/device.txt" 2>&1
  bash "$PWD/.gpu/src/scripts/gpu/h200-1gpu.sh" setup > "$base/saved/setup.txt" 2>&1 || {
    cp "$base/saved/setup.txt" "$out/"; tail -40 "$base/saved/setup.txt"; return 1; }
  cp "$PWD/.gpu/src/COMMIT" "$base/saved/"
  touch "$base/setup.done"; tail -5 "$base/saved/setup.txt"
}

stage=${1:?stage}; shift
case $stage in
  receive)
    for p in "$PWD"/.gpu/wh/parts/part* "$PWD"/.gpu/wh/parts/SHA256SUMS; do [ -e "$p" ] && mv "$p" "$base/parts/"; done
    ls "$base/parts" | tr '\n' ' '; echo
    ;;
  setup)
    ensure_setup
    ;;
  restart)
    # A router-only restart under load (scripts/gpu/restart_check.py): up (ON, fresh engines), a load, `up --set` of
    # a router setting, the same load, the router SIGKILLed and `up` again, the same load; then down.
    ensure_setup || exit 1
    "$cli" up -t "$topo" "${sets[@]}" > "$base/saved/restart-up.txt" 2>&1 || { tail -40 "$base/saved/restart-up.txt"; }
    tail -4 "$base/saved/restart-up.txt"
    "$hostpy" "$repo/scripts/gpu/restart_check.py" -t "$topo" --router http://127.0.0.1:8000 --cli "$cli" \
      "${sets[@]}" ${PDCTL_RESTART_ARGS:-} --json "$base/saved/restart-check.json" 2>&1 | tee "$base/saved/restart-check.txt"
    "$cli" status -t "$topo" "${sets[@]}" > "$base/saved/restart-status.txt" 2>&1
    "$cli" down -t "$topo" > "$base/saved/restart-down.txt" 2>&1
    logs=$(find "$PDCTL_HOME" /root/.pdctl -path '*h200-1gpu-evict/logs' -type d 2>/dev/null | head -1)
    [ -n "$logs" ] && tar -C "$logs/.." -czf "$base/saved/logs-restart.tgz" logs
    send_saved
    ;;
  go)
    deadline=$((SECONDS + ${1:-560}))
    ensure_setup || exit 1
    # shellcheck disable=SC2086  # $benches: the names, split
    run_benches "$deadline" 30 $benches
    for name in $benches; do  # a bench still running: what it has written so far comes back too
      [ -e "$base/bench-$name.saved" ] || [ ! -d "$base/bench-$name" ] ||
        { cp "$base/bench-$name.log" "$base/bench-$name/bench.log"; tar -C "$base" -czf "$out/partial-$name.tgz" "bench-$name"; }
    done
    send_saved
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
