# Sourced by scripts/test and scripts/demo: sets PY to a Python that has pdctl installed (editable, with the
# extras in $PDCTL_EXTRAS), without ever touching a system interpreter.
# - Inside an activated virtualenv ($VIRTUAL_ENV), that venv is used.
# - Otherwise the checkout's own .venv (ignored by git) is created from python3 and used: this is what makes a
#   PEP 668 "externally managed" system python3 work, and keeps pyenv/global interpreters clean.
# If python3 lacks the venv module (Debian without python3-venv), root gets it installed, others get the command.
# shellcheck shell=bash
pdctl_python() {
  local root=$1 extras=${2:-} base venv
  if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
    venv=$VIRTUAL_ENV
  else
    venv=$root/.venv
    if [ ! -x "$venv/bin/python" ]; then
      base=$(command -v python3 || true)
      if [ -z "$base" ]; then
        echo "error: no python3 on PATH; pdctl needs Python >= 3.11" >&2
        return 1
      fi
      if ! "$base" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        echo "error: $base is Python $("$base" -c 'import platform; print(platform.python_version())'); pdctl needs >= 3.11" >&2
        return 1
      fi
      if ! "$base" -c 'import venv, ensurepip' 2>/dev/null; then
        local pkg
        pkg="python3-venv"
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
          echo "installing $pkg (python3 has no venv module)" >&2
          DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$pkg" >/dev/null || return 1
        else
          echo "error: $base has no venv module; install it with: sudo apt-get install $pkg" >&2
          return 1
        fi
      fi
      echo "creating $venv (from $base)" >&2
      rm -rf "$venv"
      "$base" -m venv "$venv" || return 1
    fi
  fi
  PY=$venv/bin/python
  # Reinstall only when pyproject.toml changed since the last install into this venv.
  local stamp="$venv/.pdctl-install-${extras:-base}" want
  want="$root $(cksum <"$root/pyproject.toml")"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! "$PY" -c 'import pdctl' 2>/dev/null; then
    echo "installing pdctl${extras:+[$extras]} into $venv" >&2
    "$PY" -m pip install -q --disable-pip-version-check -e "$root${extras:+[$extras]}" || return 1
    echo "$want" >"$stamp"
  fi
  export PATH="$venv/bin:$PATH"
}
