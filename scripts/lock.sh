#!/usr/bin/env bash
# Re-lock: resolve the project's dependencies afresh (torch stays at the pinned CPU build) in a
# throw-away venv and write every resolved version to constraints.txt, which scripts/env.sh
# installs with. Run it when you mean to move to newer packages, then re-measure the README's
# figures (their benchmark JSONs record the versions they ran with).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3.11}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$python" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q torch==2.13.0
"$tmp/venv/bin/python" -m pip install -q -c <(echo torch==2.13.0) -e "$root[test,gguf,tasks]"
{
  echo "# The versions set-up installs (scripts/env.sh: pip install -c constraints.txt). Results in the README"
  echo "# were measured with these. Regenerate with scripts/lock.sh (Python 3.11, Linux x86_64)."
  echo "# torch: the CPU build 2.13.0 is found locally (pip find-links); nothing may upgrade it."
  "$tmp/venv/bin/python" -m pip freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$/torch==\1/'
} > "$root/constraints.txt"
echo "wrote $root/constraints.txt" >&2
