#!/usr/bin/env bash
# The main job: set up .venv if needed, then SFT -> GRPO -> eval of a tiny model on arithmetic.
# Extra arguments go to the experiment (e.g. --config fiddler:local).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh"
cd "$root"
# the thread settings the tests run with (scripts/test.sh): one thread per process, as the README's figures
# were measured (more threads change float rounding, and on a shared 2-core machine run 10-40x slower)
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
exec python experiments/arithmetic_tiny.py "$@"
