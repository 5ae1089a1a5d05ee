#!/usr/bin/env bash
# The real-GPU run on ONE H200 with no registry access (configs/h200-1gpu.yaml: prefill and decode sharing GPU 0),
# one stage per call of the device tool (docs/gpu-run.md). Logs go under $OUT (default ./gpu-out); everything else
# lives outside the tree in /root/pdctl-gpu, so it survives between calls while the machine is held.
#
#   h200-1gpu.sh receive          move the carried wheelhouse part(s) (./.gpu/wh/parts) out of the tree
#   h200-1gpu.sh setup            copy this tree aside, unpack the wheels, install the CLI, make the model, doctor
#   h200-1gpu.sh nixl ARGS...     scripts/gpu/nixl_same_gpu.py: NIXL READ/WRITE rates between two processes on GPU 0
#   h200-1gpu.sh up               pdctl up (provision offline, start decode then prefill, smoke, KV rate) + status
#   h200-1gpu.sh bench ARGS...    pdctl bench in the background (survives the call); then `wait`
#   h200-1gpu.sh wait SECONDS     wait for the bench, copy its report to $OUT
#   h200-1gpu.sh down             pdctl down (GPU memory back to its reading before up), then nvidia-smi
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
base=/root/pdctl-gpu
repo=$base/src        # `setup` copies this tree here: later calls need not carry it again
out=${OUT:-$here/gpu-out}
mkdir -p "$base" "$out"
export PDCTL_HOME=$base/home PYTHONUNBUFFERED=1 COLUMNS=160
topo=$repo/configs/h200-1gpu.yaml
# shellcheck source=scripts/gpu/lib.sh
. "$(dirname "$0")/lib.sh"           # hostpy, cli, sets, receive

stage=${1:?stage}; shift
case $stage in
  receive)
    receive "$PWD"
    ;;
  setup)
    rm -rf "$repo" && cp -r "$here" "$repo" || exit 1
    bash "$repo/scripts/gpu/unpack-parts.sh" "$base/parts" "$base/wh" || exit 1
    # the CLI's own deps that the host image lacks, then pdctl itself from this tree
    "$hostpy" -m pip install -q --no-index --no-deps "$base"/wh/wheels/{paramiko,bcrypt,pynacl,cryptography,cffi,pycparser,invoke,pydantic,pydantic_core,annotated_types,typing_inspection,starlette,uvicorn,httptools,orjson}-*.whl || exit 1
    "$hostpy" -m pip install -q --no-index --no-deps --no-build-isolation "$repo" || exit 1
    "$hostpy" "$repo/scripts/make_dummy_model.py" --arch qwen3-8b --out /root/models/qwen3-8b-dummy || exit 1
    "$cli" --version
    "$cli" validate -t "$topo"
    # before `up`, vLLM and NIXL are missing: doctor lists them (exit 1) with what `up` will do about it
    "$cli" doctor -t "$topo" "${sets[@]}" 2>&1 | tee "$out/doctor.txt" || true
    ;;
  nixl)
    PYTHONPATH=$(ls -d /opt/torch/.venv/lib/python3*/site-packages) "$hostpy" "$repo/scripts/gpu/nixl_same_gpu.py" \
      --json "$out/nixl.json" --log-dir "$out/nixl-logs" "$@" 2>&1 | tee "$out/nixl.txt"
    ;;
  up)
    nvidia-smi --query-gpu=index,memory.used --format=csv | tee "$out/gpus-before-up.txt"
    "$cli" up -t "$topo" "${sets[@]}" "$@" 2>&1 | tee "$out/up.txt"
    rc=${PIPESTATUS[0]}
    "$cli" status -t "$topo" 2>&1 | tee "$out/status.txt"
    for f in /root/.pdctl/h200-1gpu/logs/*.log; do echo "== $f"; grep -a -E "KV Transfer metrics|UCX|ERROR" "$f" | tail -n 30; tail -n 30 "$f"; done > "$out/logs-tail.txt" 2>&1
    exit "$rc"
    ;;
  bench)
    rm -rf "$base/bench-out"
    setsid nohup "$cli" bench -t "$topo" "${sets[@]}" --out "$base/bench-out" "$@" >"$base/bench.log" 2>&1 &
    echo "bench started, pid $!"
    ;;
  wait)
    deadline=$((SECONDS + ${1:-500}))
    while [ $SECONDS -lt $deadline ] && pgrep -f "$cli bench" >/dev/null; do sleep 5; done
    tail -c 20000 "$base/bench.log" > "$out/bench.log"
    grep -a -h "KV Transfer metrics" /root/.pdctl/h200-1gpu/logs/*.log > "$out/kvmetrics.txt" 2>/dev/null
    if pgrep -f "$cli bench" >/dev/null; then echo "bench still running"; tail -5 "$base/bench.log"; exit 3; fi
    tar -C "$base" -czf "$out/bench-out.tgz" bench-out   # $OUT returns at most 8 files
    cp "$base/bench-out/report.md" "$out/" 2>/dev/null
    tail -40 "$base/bench.log"
    ;;
  down)
    "$cli" down -t "$topo" 2>&1 | tee "$out/down.txt"
    rc=${PIPESTATUS[0]}
    nvidia-smi --query-gpu=index,memory.used --format=csv | tee "$out/gpus-after-down.txt"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv | tee -a "$out/gpus-after-down.txt"
    exit "$rc"
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
