#!/usr/bin/env bash
# Validate the GPU code paths on one bare GPU machine, offline, in about 8 minutes; every result as JSON in one folder.
#
#   bash scripts/gpu_wheels.sh            # first, where PyPI is reachable: the wheels the GPU image lacks -> .whl/
#   bash scripts/gpu_check.sh [OUT_DIR]   # on the GPU machine, from the checkout (with .whl/ beside it)
#
# Written for one H100 or H200 with Python 3.12, torch, transformers and accelerate installed and no ray, aim,
# vllm or network: it installs .whl/ into a private folder, then runs, each under its own time limit
#   1. env         the device, driver and package versions
#   2. gpu_tests   the `gpu`-marked tests (bf16 compute on fp32 masters, FSDP2 over NCCL, CUDA generation)
#   3. grpo        experiments/qwen_gsm8k.py at its real shape (fiddler:random_init) for 3 steps on LocalRuntime
#   4. memory_plan benchmarks/memory_plan.py --device cuda: the memory planner vs torch.cuda.max_memory_allocated
#   5. gpu_step    benchmarks/gpu_step.py: one GRPO step of a Qwen2.5-0.5B-shaped random model, rlhf vs TRL vs
#                  plain PyTorch (seconds per phase, peak memory)
# GPU_CHECK_STEPS="grpo gpu_step" runs only the steps it names.
# and writes OUT_DIR/summary.json (each step's exit code, seconds and result files) and OUT_DIR/logs.tar.gz.
# Exits 2 at once where no CUDA device is visible, 1 when any step failed.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${1:-${OUT:-$root/gpu_check}}"
python="${PYTHON:-python3}"
mkdir -p "$out/logs"
began=$(date +%s)

if ! "$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >"$out/logs/cuda.log" 2>&1; then
  echo "gpu_check: no CUDA device visible to $python (torch.cuda.is_available() is False; see $out/logs/cuda.log):" \
       "run this on a GPU machine; the CPU paths are tested by scripts/test.sh" >&2
  exit 2
fi

site=/tmp/rlhf-gpu-check-site
if compgen -G ".whl/*.whl" >/dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
    >"$out/logs/wheels.log" 2>&1 || { echo "gpu_check: installing .whl/ failed (see $out/logs/wheels.log)" >&2; exit 1; }
fi
export PYTHONPATH="$root:$site${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

: >"$out/logs/steps.jsonl"
steps="${GPU_CHECK_STEPS:-env gpu_tests grpo memory_plan gpu_step}"  # a subset reruns only those
step() {  # step NAME SECONDS COMMAND...: run it under a time limit, log it, record its exit code and seconds
  local name=$1 limit=$2 t0 rc
  shift 2
  [[ " $steps " == *" $name "* ]] || return 0
  t0=$(date +%s)
  echo "[gpu_check] $name (limit ${limit}s) ..." >&2
  timeout --kill-after=10 "$limit" "$@" >"$out/logs/$name.log" 2>&1
  rc=$?
  printf '{"step": "%s", "rc": %d, "seconds": %d, "limit_s": %d}\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$limit" \
    >>"$out/logs/steps.jsonl"
  echo "[gpu_check] $name: exit $rc in $(( $(date +%s) - t0 ))s" >&2
}

step env 60 "$python" -c '
import json, subprocess, sys, torch, transformers, accelerate
p = torch.cuda.get_device_properties(0)
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip()
print(json.dumps({"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
                  "transformers": transformers.__version__, "accelerate": accelerate.__version__,
                  "device": p.name, "memory_gib": round(p.total_memory / 2**30, 1), "nvidia_smi": smi}))'
mapfile -t gpu_tests < <(grep -rlE "pytest\.mark\.gpu|mark\.gpu\b" tests --include='test_*.py' | sort)
step gpu_tests 120 "$python" -m pytest -q -p no:cacheprovider -m gpu --timeout 120 "${gpu_tests[@]}" \
  --junitxml "$out/logs/gpu_tests.xml"
step memory_plan 150 "$python" benchmarks/memory_plan.py --device cuda --tolerance 0.25 --out "$out/memory_plan-cuda.json"
step grpo 120 "$python" experiments/qwen_gsm8k.py --config fiddler:random_init --config fiddler:local \
  --config fiddler:no_tracking --config fiddler:quiet --config 'set:run_name="gpu_check"'
step gpu_step 230 "$python" benchmarks/gpu_step.py --steps 1 --frameworks rlhf,trl,plain --child-timeout 100 --out "$out"
cp outputs/qwen_gsm8k/gpu_check/grpo/result.json "$out/grpo-result.json" 2>/dev/null || true

"$python" - "$out" "$began" <<'EOF'
import json, pathlib, sys, time
out = pathlib.Path(sys.argv[1])
steps = [json.loads(line) for line in (out / "logs" / "steps.jsonl").read_text().splitlines() if line.strip()]
env_log = (out / "logs" / "env.log").read_text().strip().splitlines()
summary = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": int(time.time()) - int(sys.argv[2]),
           "env": json.loads(env_log[-1]) if env_log and env_log[-1].startswith("{") else None, "steps": steps,
           "passed": all(s["rc"] == 0 for s in steps),
           "results": sorted(p.name for p in out.glob("*.json") if p.name != "summary.json")}
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps(summary, indent=1))
EOF
tar -czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$out/logs"
"$python" -c "import json, sys; sys.exit(0 if json.load(open('$out/summary.json'))['passed'] else 1)"
