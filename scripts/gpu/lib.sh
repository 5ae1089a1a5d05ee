# Sourced by the stage scripts of the real-GPU runs (h200-1gpu.sh, h200x2.sh) after they set `base`, their home
# outside the tree: the host image's interpreter and CLI, the offline wheelhouse, and the `receive` stage.
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
