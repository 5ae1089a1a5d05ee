#!/usr/bin/env bash
# Build an offline wheelhouse (python.wheelhouse) for nodes that cannot reach a package index, on a machine that can.
#
# usage: scripts/gpu/build-wheelhouse.sh [options] OUTDIR [REQUIREMENT ...]
#
# OUTDIR/wheels/ receives the wheels; point the topology at it:
#   pdctl up -t pdctl.yaml --set python.wheelhouse=OUTDIR/wheels --dry-run
#
# What it downloads:
#   default        vLLM and NIXL at pdctl's node versions (pyproject.toml's `node` extra), each with its
#                  dependencies, for the nodes' Python and platform
#   --list FILE    instead, exactly the wheels FILE pins, without their dependencies: a verified set such as
#                  docs/gpu-run-wheels-vllm-0.26.0.txt, installed as it is with `python.no_deps: true`
#   always         pdctl's own dependencies (pyproject.toml), with theirs: the router and the simulator run the
#                  CLI's pdctl on the nodes; and any REQUIREMENT given after OUTDIR, with its dependencies
#
# options:
#   --python-version V   the nodes' Python (default 3.12)
#   --platform TAG       a platform tag of the nodes (repeatable; default: the manylinux x86_64 tags)
#   --here               for this machine's Python and platform instead (the nodes are like it)
#   --parts SIZE         also tar OUTDIR/wheels and split it into OUTDIR/parts/partNN of SIZE (e.g. 62M), with
#                        OUTDIR/parts/SHA256SUMS, to carry it in pieces (scripts/gpu/unpack-parts.sh joins them)
#   --dry-run            print the commands, download nothing
#   -h, --help           this text
#
# PYTHON (default python3) runs pip; pip's own settings apply (PIP_INDEX_URL, PIP_FIND_LINKS, ...).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { echo "build-wheelhouse.sh: $1" >&2; echo "see: scripts/gpu/build-wheelhouse.sh --help" >&2; exit 2; }

py=${PYTHON:-python3}
list="" pyver=3.12 here=0 parts="" dry=0 out=""
platforms=() extras=()
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --list) list=${2:?--list needs a file}; shift ;;
    --python-version) pyver=${2:?--python-version needs a version like 3.12}; shift ;;
    --platform) platforms+=("${2:?--platform needs a tag like manylinux_2_28_x86_64}"); shift ;;
    --here) here=1 ;;
    --parts) parts=${2:?--parts needs a size like 62M}; shift ;;
    --dry-run) dry=1 ;;
    -*) die "unknown option $1" ;;
    *) if [ -z "$out" ]; then out=$1; else extras+=("$1"); fi ;;
  esac
  shift
done
[ -n "$out" ] || die "OUTDIR is missing"
[ -z "$list" ] || [ -f "$list" ] || die "--list $list: no such file"
[ -f "$repo/pyproject.toml" ] || die "$repo/pyproject.toml not found: run the script from a pdctl checkout"

# pyproject.toml's lists: the CLI's dependencies, and the `node` extra (vllm==..., nixl==...)
deps() {
  "$py" - "$repo/pyproject.toml" "$1" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
reqs = project["dependencies"] if sys.argv[2] == "cli" else project["optional-dependencies"][sys.argv[2]]
print("\n".join(r.split(";")[0].strip() for r in reqs))
PY
}
mapfile -t cli < <(deps cli)
mapfile -t node < <(deps node)

target=()
if [ "$here" = 0 ]; then
  if [ ${#platforms[@]} -eq 0 ]; then
    platforms=(manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_26_x86_64
               manylinux_2_27_x86_64 manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64
               manylinux_2_35_x86_64 manylinux1_x86_64 manylinux_2_5_x86_64)
  fi
  target=(--only-binary=:all: --python-version "$pyver" --implementation cp)
  for p in "${platforms[@]}"; do target+=(--platform "$p"); done
fi
wheels="$out/wheels"

run() {
  if [ "$dry" = 1 ]; then printf '%q ' "$@" | sed 's/ $//'; echo; else "$@"; fi
}

run mkdir -p "$wheels"
pip=("$py" -m pip download --disable-pip-version-check -q "${target[@]}" -d "$wheels")
if [ -n "$list" ]; then
  run "${pip[@]}" --no-deps -r "$list"
  run "${pip[@]}" "${cli[@]}" "${extras[@]}"
else
  run "${pip[@]}" "${node[@]}" "${cli[@]}" "${extras[@]}"
fi
if [ -n "$parts" ]; then
  run mkdir -p "$out/parts"
  if [ "$dry" = 1 ]; then
    echo "rm -f $(printf '%q' "$out/parts")/part*"
    echo "tar -C $(printf '%q' "$out") -cf - wheels | split -b $(printf '%q' "$parts") -d -a 2 - $(printf '%q' "$out/parts/part")"
    echo "(cd $(printf '%q' "$out/parts") && sha256sum part* > SHA256SUMS)"
  else
    rm -f "$out/parts/"part*
    tar -C "$out" -cf - wheels | split -b "$parts" -d -a 2 - "$out/parts/part"
    (cd "$out/parts" && sha256sum part* > SHA256SUMS)
  fi
fi
if [ "$dry" = 1 ]; then
  echo "dry run: nothing downloaded"
else
  echo "wheels: $(find "$wheels" -maxdepth 1 -type f | wc -l) files in $wheels ($(du -sh "$wheels" | cut -f1))"
  echo "next: pdctl up -t pdctl.yaml --set python.wheelhouse=$wheels --dry-run"
fi
