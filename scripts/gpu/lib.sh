# Sourced by the stage scripts of the real-GPU runs (h200-1gpu.sh, h200x2.sh, h200-1gpu-r2.sh, h200-1gpu-evict.sh)
# after they set `base`, their home outside the tree: the host image's interpreter and CLI, the offline wheelhouse, and the `receive` stage.
hostpy=/opt/torch/.venv/bin/python   # the host image keeps torch in this venv
cli=/opt/torch/.venv/bin/pdctl
sets=(--set "python.wheelhouse=$base/wh/wheels")

# receive DIR: move the wheelhouse part(s) the call carried in DIR/.gpu/wh/parts out of the tree, to $base/parts
receive() {
  mkdir -p "$base/parts"
  for p in "$1"/.gpu/wh/parts/part*; do [ -e "$p" ] && mv "$p" "$base/parts/"; done
  cp "$1/.gpu/wh/parts/SHA256SUMS" "$base/parts/" 2>/dev/null
  ls -l "$base/parts"
}

# The background benches of a one-stage-per-call GPU run (h200-1gpu-r2.sh, h200-1gpu-evict.sh). The caller sets
# `out` and defines `start_bench NAME LEGS...` (starts `pdctl bench` in the background, its pid in
# $base/bench-NAME.pid) and `save NAME` (the finished bench's report and logs into $base/saved); the legs of bench
# NAME are the array `legs_NAME`.

# bench_running NAME: whether bench NAME still runs (its pid, or a process with its --out)
bench_running() {
  { [ -e "$base/bench-$1.pid" ] && kill -0 "$(cat "$base/bench-$1.pid")" 2>/dev/null; } ||
    pgrep -f -- "--out $base/bench-$1 " >/dev/null
}

# run_benches DEADLINE TAIL NAMES...: each bench not saved yet, in turn: started once, waited for until DEADLINE
# ($SECONDS), saved when done (printing the last TAIL lines of its log); the first still running at the deadline
# ends the call, to be waited for again by the next one.
run_benches() {
  local deadline=$1 tail=$2 name; shift 2
  for name in "$@"; do
    [ -e "$base/bench-$name.saved" ] && continue
    if ! bench_running "$name" && [ ! -e "$base/bench-$name.pid" ]; then
      local -n legs="legs_$name"
      start_bench "$name" "${legs[@]}"
      unset -n legs
    fi
    while [ "$SECONDS" -lt "$deadline" ] && bench_running "$name"; do sleep 5; done
    if bench_running "$name"; then echo "bench $name still running ($(date -u +%T))"; tail -8 "$base/bench-$name.log"; return 0; fi
    save "$name"; echo "bench $name done ($(date -u +%T))"; tail -"$tail" "$base/bench-$name.log"
  done
}

# send_saved: the versions and GPU memory now, then everything saved into $out ($OUT returns at most 8 files: the
# benches' and logs' tarballs, and one of everything else)
send_saved() {
  "$hostpy" -m pip list 2>/dev/null | grep -i -E "^(vllm|nixl|nixl-cu13|torch|ucx) " > "$base/saved/versions.txt"
  nvidia-smi --query-gpu=index,memory.used --format=csv > "$base/saved/gpu-now.txt"
  tar -C "$base/saved" -czf "$out/meta.tgz" --exclude='*.tgz' .
  cp "$base/saved/"*.tgz "$out/" 2>/dev/null
  ls -l "$out"
}
