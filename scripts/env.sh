#!/usr/bin/env bash
# Create or update the project's virtual environment (.venv) idempotently.
# Re-installs only when pyproject.toml or constraints.txt changed since the last install.
# Usage: source scripts/env.sh   (or run it; it prints the venv path)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${RLHF_VENV:-$root/.venv}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3
stamp="$venv/.rlhf-install-stamp"
want="$(cat "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -d' ' -f1)"
pip_quiet() {  # pip, minus the noise of this machine's extra index locations
  "$venv/bin/python" -m pip "$@" -q 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
  return "${PIPESTATUS[0]}"
}
if [ ! -x "$venv/bin/python" ]; then
  echo "[env] creating $venv" >&2
  "$python" -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[env] installing dependencies into $venv (first time: a few minutes)" >&2
  # torch first, pinned: the CPU build found locally; never an unpinned torch.
  pip_quiet install -c "$root/constraints.txt" torch
  pip_quiet install -c "$root/constraints.txt" -e "$root[test,gguf,tasks]"
  echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
export VIRTUAL_ENV="$venv"
