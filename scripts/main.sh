#!/usr/bin/env bash
# The main job: set up .venv if needed, then SFT -> GRPO -> eval of a tiny model on arithmetic.
# Extra arguments go to the experiment (e.g. --config fiddler:local).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh"
cd "$root"
exec python experiments/arithmetic_tiny.py "$@"
