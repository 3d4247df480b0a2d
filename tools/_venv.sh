# Sourced by tools/test and tools/demo: makes .venv from pyproject.toml when it is
# missing or pyproject.toml changed since it was made.
# Usage: ensure_venv EXTRA
ensure_venv() {
  local extra="$1"
  local root
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  local venv="$root/.venv"
  local stamp="$venv/.grainlike-$extra"
  local want
  want="$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1)"
  if [ ! -x "$venv/bin/python" ]; then
    echo "Creating $venv ..." >&2
    "${PYTHON:-python3}" -m venv "$venv"
  fi
  # An environment made for a larger extra serves a smaller one (bench > dev > all):
  # ./tools/demo after ./tools/test installs nothing.
  local covering=""
  case "$extra" in
    all) covering="dev bench" ;;
    dev) covering="bench" ;;
  esac
  local other
  for other in $covering; do
    if [ -f "$venv/.grainlike-$other" ] && [ "$(cat "$venv/.grainlike-$other")" = "$want" ]; then
      stamp="$venv/.grainlike-$other"
    fi
  done
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "Installing grainlike[$extra] into $venv (a few minutes the first time; pip lists each package) ..." >&2
    "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
    # Not --quiet: a first run spends minutes here, and a line per package shows it is moving.
    "$venv/bin/python" -m pip install --progress-bar off -e "$root[$extra]" >&2
    echo "$want" > "$stamp"
  fi
  PY="$venv/bin/python"
  export PY
}
