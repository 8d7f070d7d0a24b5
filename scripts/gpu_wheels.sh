#!/usr/bin/env bash
# Companion of scripts/gpu_check.sh, run on a machine that reaches PyPI (a CPU machine is fine): download the
# pure-Python wheels the GPU machine's image lacks (Python 3.12; torch, transformers, accelerate, numpy, pandas,
# pyarrow, pytest, hypothesis, rich, tqdm, peft are there; ray, aim, vllm are not and are not needed: the check
# runs LocalRuntime without tracking) into .whl/ (git-ignored), at most 64 MiB together.
#
#   bash scripts/gpu_wheels.sh            # then carry `.whl` with the checkout and run scripts/gpu_check.sh there
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$root/.whl}"
python="${PYTHON:-python3}"
mkdir -p "$dest"
# name==version from constraints.txt where pinned there (the versions the project is tested with)
pinned() { grep -iE "^${1//[-_]/[-_]}==" "$root/constraints.txt" | head -1 || true; }
wheels=(fiddle gin-config libcst graphviz annotated-types pydantic pydantic-core typing-inspection datasets dill multiprocess
        trl pytest-timeout)
specs=()
for name in "${wheels[@]}"; do
  spec="$(pinned "$name")"
  specs+=("${spec:-$name}")
done
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$dest" "${specs[@]}"
total=$(du -sm "$dest" | cut -f1)
echo "[gpu_wheels] ${#specs[@]} wheels in $dest (${total} MiB)"
if [ "$total" -gt 60 ]; then
  echo "[gpu_wheels] over the 64 MiB a device call may carry: remove some from $dest" >&2
  exit 1
fi
