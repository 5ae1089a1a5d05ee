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
#   h200-1gpu.sh up-bpe           `up` in the background with the byte-level BPE model dir carried in bpe-model/
#                                 (scripts/tokenizer_cost.py --model-dir), 0.3 of the GPU per engine, no smoke test
#                                 (a random model's replies do not re-tokenize to the same BPE ids: turn 2 is partial);
#                                 decoder_kv_blocks_ttl 40 s: at 0.3 of the GPU the decode holds ~150k tokens, and with
#                                 480 s the finished conversations' held blocks filled it and a new turn waited ~7 min
#   h200-1gpu.sh measure SECONDS  wait for up-bpe, run scripts/gpu/prefix_check_vllm.py on P and D, start one
#                                 aggregated vLLM beside them (0.3, prefix caching), then (TOKENIZER=1:
#                                 scripts/gpu/tokenizer_vllm.py and) scripts/critical_path.py on the running engines,
#                                 chat and token ids; steps already done are skipped, none starts late
#   h200-1gpu.sh prefix-check [SECONDS [ARGS...]]
#                                 wait (up to SECONDS, default 300) for the engines up-bpe starts, then
#                                 scripts/gpu/prefix_check_vllm.py on P and D directly: the patched prefill verifies
#                                 pdctl's digest chain (hit, partial, miss, no spec); one PASS/FAIL line per case
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
base=/root/pdctl-gpu
repo=$base/src        # `setup` copies this tree here: later calls need not carry it again
bpe=/root/models/qwen3-8b-bpe        # up-bpe: the model dir with a byte-level BPE tokenizer
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
    # (the newest wheel of each: the wheel list and the CLI's extras may each bring a version)
    "$hostpy" -m pip install -q --no-index --no-deps $(for n in paramiko bcrypt pynacl cryptography cffi pycparser invoke \
      pydantic pydantic_core annotated_types typing_inspection starlette uvicorn httptools orjson; do
      ls "$base"/wh/wheels/"$n"-*.whl | sort -V | tail -1; done) || exit 1
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
  up-bpe)
    mkdir -p /root/models && rm -rf "$bpe" && cp -r "$repo/bpe-model" "$bpe" || exit 1
    OUT=$base/up-out setsid nohup bash "$repo/scripts/gpu/h200-1gpu.sh" up --set "model.local_dir=$bpe" \
      --set model.gpu_memory_utilization=0.3 --set connector.decoder_kv_blocks_ttl=40 --set router.handle_ttl=30 \
      --no-smoke-test >"$base/up-bpe.log" 2>&1 &
    echo $! > "$base/up.pid"; echo "up started, pid $!"
    ;;
  measure)
    deadline=$((SECONDS + ${1:-540}))
    res=$base/results; mkdir -p "$res"
    step() {  # step NAME SECONDS_NEEDED COMMAND...: once, and only when it can finish before the deadline
      local name=$1 need=$2; shift 2
      [ -e "$res/$name.done" ] && return 0
      [ $((SECONDS + need)) -gt $deadline ] && { echo "not starting $name: ${need}s needed"; return 1; }
      echo "== $name ($(date -u +%T))"; "$@" 2>&1 | tee "$res/$name.txt"
      [ "${PIPESTATUS[0]}" = 0 ] && touch "$res/$name.done"
    }
    wait_url() {  # wait_url URL SECONDS
      local end=$((SECONDS + $2))
      until curl -sf "$1/health" >/dev/null; do [ $SECONDS -ge $end ] && return 1; sleep 3; done
    }
    agg() {
      if ! curl -sf http://127.0.0.1:8300/health >/dev/null; then
        setsid nohup /opt/torch/.venv/bin/vllm serve "$bpe" --served-model-name Qwen --dtype bfloat16 \
          --max-model-len 32768 --max-num-seqs 8 --host 127.0.0.1 --port 8300 --block-size 256 \
          --load-format dummy --gpu-memory-utilization 0.3 >"$base/agg.log" 2>&1 &
      fi
      wait_url http://127.0.0.1:8300 $((deadline - SECONDS - 5)); rc=$?; tail -5 "$base/agg.log"; return $rc
    }
    corpus() { "$hostpy" -c "import sys; sys.path.insert(0, '$repo'); from scripts.tokenizer_cost import corpus
open('$base/corpus.txt', 'w').write(chr(10).join(corpus()))"; }
    cp_args=(--router http://127.0.0.1:8000 --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200
             --aggregated http://127.0.0.1:8300 --conversations 2 --turns 4 --source "$base/corpus.txt"
             --engine-key-file "/root/.pdctl/h200-1gpu/engine.key")
    wait_up() {  # the router answers once `up` has started every engine and the router
      until curl -sf http://127.0.0.1:8000/health >/dev/null || ! kill -0 "$(cat "$base/up.pid")" 2>/dev/null; do
        [ $SECONDS -ge $((deadline - 60)) ] && break; sleep 3
      done
      tail -n 25 "$base/up-bpe.log"; curl -sf http://127.0.0.1:8000/health
    }
    step up 5 wait_up || exit 3
    step prefix-check 60 "$hostpy" "$repo/scripts/gpu/prefix_check_vllm.py" --prefill http://127.0.0.1:8100 \
      --decode http://127.0.0.1:8200 --engine-key-file /root/.pdctl/h200-1gpu/engine.key --json "$res/prefix-check.json"
    step agg 60 agg || exit 3
    step corpus 5 corpus
    if [ -n "${TOKENIZER:-}" ]; then  # measured once (docs/results/h200-1gpu/tokenizer); TOKENIZER=1 repeats it
      step tokenizer 60 "$hostpy" "$repo/scripts/gpu/tokenizer_vllm.py" --url http://127.0.0.1:8300 --model-dir "$bpe" \
        --reps 20 --json "$res/tokenizer.json"
    fi
    step cp-completions 150 "$hostpy" "$repo/scripts/critical_path.py" "${cp_args[@]}" --api completions \
      --json "$res/cp-completions.json" --out "$res/cp-completions"
    step cp-chat 150 "$hostpy" "$repo/scripts/critical_path.py" "${cp_args[@]}" --api chat --tokens-per-word 0 \
      --json "$res/cp-chat.json" --out "$res/cp-chat"
    step cp-chat-2 150 "$hostpy" "$repo/scripts/critical_path.py" "${cp_args[@]}" --api chat --tokens-per-word 0 \
      --seed 10 --json "$res/cp-chat-2.json"
    step cp-completions-2 150 "$hostpy" "$repo/scripts/critical_path.py" "${cp_args[@]}" --api completions \
      --seed 10 --json "$res/cp-completions-2.json"
    for f in /root/.pdctl/h200-1gpu/logs/*.log "$base/agg.log" "$base/up-bpe.log"; do
      echo "== $f"; grep -a -E "KV Transfer metrics|ERROR|Traceback" "$f" | tail -n 10; tail -n 15 "$f"
    done > "$res/logs-tail.txt" 2>&1
    nvidia-smi --query-gpu=index,memory.used,clocks.sm --format=csv >> "$res/logs-tail.txt"
    tar -C "$base" -czf "$out/results.tgz" results
    cat "$res"/*.txt | grep -a -E "^\||target|tokens per word|not starting" | tail -n 80
    ;;
  prefix-check)
    deadline=$((SECONDS + ${1:-300})); [ $# -gt 0 ] && shift
    until curl -sf http://127.0.0.1:8100/health >/dev/null && curl -sf http://127.0.0.1:8200/health >/dev/null; do
      if [ $SECONDS -ge $deadline ]; then echo "prefill/decode not healthy yet"; tail -n 25 "$base/up-bpe.log"; exit 3; fi
      sleep 3
    done
    grep -a -E "vllm.compat|verify prefixes" "$base/up-bpe.log" | tail -n 5
    "$hostpy" "$repo/scripts/gpu/prefix_check_vllm.py" --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 \
      --engine-key-file /root/.pdctl/h200-1gpu/engine.key --json "$out/prefix-check.json" "$@" 2>&1 \
      | tee "$out/prefix-check.txt"
    rc=${PIPESTATUS[0]}
    for f in /root/.pdctl/h200-1gpu/logs/*.log; do
      echo "== $f"; grep -a -E "KV Transfer metrics|ERROR|Traceback" "$f" | tail -n 10
    done > "$out/prefix-check-logs.txt" 2>&1
    exit "$rc"
    ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
esac
