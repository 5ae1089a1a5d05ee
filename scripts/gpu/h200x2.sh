#!/usr/bin/env bash
# The real-GPU proof on a two-H200 host with no registry access, one stage per call (docs/gpu-run.md).
# Each stage writes its log under $OUT (default ./gpu-out). Everything lives outside the repo tree
# (/root/pdctl-gpu), so it survives between calls while the machine is held.
#
#   scripts/gpu/h200x2.sh receive          move the carried wheelhouse part(s) out of the tree
#   scripts/gpu/h200x2.sh setup            unpack the wheels, install the pdctl CLI, make the dummy model, doctor
#   scripts/gpu/h200x2.sh up               pdctl up (provision offline, patch vLLM, start, smoke test) + status
#   scripts/gpu/h200x2.sh bench ARGS...    pdctl bench in the background (survives the call); then `wait`
#   scripts/gpu/h200x2.sh wait SECONDS     wait for the bench, copy its report to $OUT
#   scripts/gpu/h200x2.sh direct ARGS...   router vs hand-made P/D hops on the running deployment
#   scripts/gpu/h200x2.sh down             pdctl down, then nvidia-smi to show the GPUs are empty
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
base=/root/pdctl-gpu
out=${OUT:-$repo/gpu-out}
mkdir -p "$base" "$out"
export PDCTL_HOME=$base/home PYTHONUNBUFFERED=1 COLUMNS=160
topo=$repo/configs/h200x2-local.yaml
# shellcheck source=scripts/gpu/lib.sh
. "$(dirname "$0")/lib.sh"           # hostpy, cli, sets, receive

stage=${1:?stage}; shift
case $stage in
  receive)
    receive "$repo"
    ;;
  setup)
    bash "$repo/scripts/gpu/unpack-parts.sh" "$base/parts" "$base/wh" || exit 1
    # the CLI's own deps that the host image lacks, then pdctl itself from this tree
    "$hostpy" -m pip install -q --no-index --no-deps "$base"/wh/wheels/{paramiko,bcrypt,pynacl,cryptography,cffi,pycparser,invoke,pydantic,pydantic_core,annotated_types,typing_inspection,starlette,uvicorn,httptools}-*.whl || exit 1
    "$hostpy" -m pip install -q --no-index --no-deps --no-build-isolation "$repo" || exit 1
    "$hostpy" "$repo/scripts/make_dummy_model.py" --out /root/models/qwen3-32b-dummy || exit 1
    nvidia-smi topo -m | tee "$out/topo.txt"
    "$cli" --version
    # before `up`, vLLM and NIXL are missing: doctor lists them (exit 1) with what `up` will do about it
    "$cli" doctor -t "$topo" "${sets[@]}" 2>&1 | tee "$out/doctor.txt" || true
    ;;
  up)
    "$cli" up -t "$topo" "${sets[@]}" "$@" 2>&1 | tee "$out/up.txt"
    rc=${PIPESTATUS[0]}
    "$cli" status -t "$topo" 2>&1 | tee "$out/status.txt"
    for f in /root/.pdctl/h200x2/logs/*.log; do echo "== $f"; tail -n 60 "$f"; done > "$out/logs-tail.txt" 2>&1
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
    if pgrep -f "$cli bench" >/dev/null; then echo "bench still running"; tail -5 "$base/bench.log"; exit 3; fi
    tar -C "$base" -czf "$out/bench-out.tgz" bench-out   # $OUT returns at most 8 files
    cp "$base/bench-out/report.md" "$out/" 2>/dev/null
    tail -40 "$base/bench.log"
    ;;
  direct)
    # the router against two hops done by hand, on the running deployment (scripts/gpu/direct_vs_router.py)
    "$hostpy" "$repo/scripts/gpu/direct_vs_router.py" --json "$out/direct.json" "$@" 2>&1 | tee "$out/direct.txt"
    ;;
  down)
    "$cli" down -t "$topo" 2>&1 | tee "$out/down.txt"
    nvidia-smi --query-gpu=index,memory.used --format=csv | tee "$out/gpus-after-down.txt"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv | tee -a "$out/gpus-after-down.txt"
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
