"""What a short GRPO run writes to disk, and the policy worker's memory, full fine-tune vs LoRA.

A GRPO stage on MODEL (default: SmolLM2-135M-Instruct from `rlhf models import`), 3 steps of
2 prompts x 2 samples x 4 new tokens, AdamW, k3 KL against the reference (= the initial model),
`save_freq=2` (checkpoints at steps 2 and 3, both kept), fp32 on CPU, LocalRuntime. Each variant
runs in its own process, so its peak RSS is its own:

  full:  every weight trained
  lora:  a rank-8 LoRA adapter trained (PolicyWorker(adapter=LoRA(...)))

Reported per variant: the bytes of each checkpoint folder and of its parts (weights+optimizer
shards, the `hf/` config and tokenizer), of `final/` (and `final-adapter/`), of the whole stage
folder, the checkpoint write time, the parameter bytes the policy worker holds per model, and the
process's peak RSS. To compare code versions, run it once per version with that version first on
PYTHONPATH (the script uses only what both versions have):

    python benchmarks/checkpoint_cost.py --label after
    PYTHONPATH=/path/to/old/tree python benchmarks/checkpoint_cost.py --label before
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def child(variant: str, model: str, out: Path) -> dict:
    """One GRPO stage in this process; returns its sizes, timings and peak RSS."""
    import fiddle as fdl
    import torch

    from rlhf.algos import KLLoss, PPOClipLoss, kl_k3
    from rlhf.data.generators import arithmetic_rows
    from rlhf.data.prompts import PromptDataset
    from rlhf.models.loading import load_tokenizer
    from rlhf.rewards.arithmetic import digit_match_score
    from rlhf.rewards.manager import RewardManager
    from rlhf.rollout.sampling import SamplingParams
    from rlhf.runtime.experiment import Experiment, run_experiment
    from rlhf.runtime.local import LocalRuntime
    from rlhf.trainers import checkpoint as checkpoint_module
    from rlhf.trainers.rl import RLTrainer
    from rlhf.workers.objectives import PolicyObjective
    from rlhf.workers.policy import PolicyWorker
    from rlhf_configs.pieces import policy_group

    torch.set_num_threads(1)
    save_seconds: list[float] = []
    original_save = checkpoint_module.CheckpointManager.save

    def timed_save(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original_save(self, *args, **kwargs)
        finally:
            save_seconds.append(time.perf_counter() - start)

    checkpoint_module.CheckpointManager.save = timed_save
    held: dict[str, int] = {}
    original_log = PolicyWorker._log_placement

    def record_placement(self):
        held.update(self.parameter_bytes())
        original_log(self)

    PolicyWorker._log_placement = record_placement

    tok = fdl.Config(load_tokenizer, model)
    worker = dict(model_path=model, ref_model_path=model,
                  objective=fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss),
                                       kl_loss=fdl.Config(KLLoss, estimator=kl_k3, coef=0.01)),
                  optimizer=fdl.Partial(torch.optim.AdamW, lr=1e-5 if variant == "full" else 1e-4))
    if variant == "lora":
        from rlhf.workers.lora import LoRA

        rank_name = "rank" if "rank" in inspect.signature(LoRA).parameters else "r"  # the older code calls it r
        worker["adapter"] = fdl.Config(LoRA, **{rank_name: 8, "alpha": 16})
    stage = fdl.Config(
        RLTrainer,
        policy=policy_group(**worker),
        tokenizer=tok,
        train_data=fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=8), tokenizer=tok),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": digit_match_score}),
        sampling=fdl.Config(SamplingParams, n=2, max_new_tokens=4),
        prompts_per_step=2,
        total_steps=3,
        save_freq=2,
    )
    graph = fdl.Config(Experiment, name="ckpt", stages={"grpo": stage}, runtime=fdl.Config(LocalRuntime),
                       output_dir=str(out), progress=False, run_name="r")
    start = time.perf_counter()
    run_experiment(graph)
    seconds = time.perf_counter() - start
    stage_dir = out / "ckpt" / "r" / "grpo"
    checkpoints = {}
    for folder in sorted((stage_dir / "checkpoints").glob("step_*")):
        checkpoints[folder.name] = {
            "bytes": folder_bytes(folder),
            "weights_and_optimizer_bytes": folder_bytes(folder / "policy" / "dcp") + sum(
                p.stat().st_size for p in (folder / "policy").glob("*.safetensors")),
            "hf_bytes": folder_bytes(folder / "policy" / "hf"),
        }
    return {
        "variant": variant,
        "checkpoints": checkpoints,
        "final_bytes": folder_bytes(stage_dir / "final"),
        "final_adapter_bytes": folder_bytes(stage_dir / "final-adapter"),
        "stage_bytes": folder_bytes(stage_dir),
        "checkpoint_save_s": save_seconds,
        "policy_parameter_bytes": held,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "run_s": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: smollm2-135m-instruct, imported)")
    parser.add_argument("--label", default="run", help="names this measurement in the results (before/after)")
    parser.add_argument("--variants", default="full,lora")
    parser.add_argument("--out", default=None, help="results JSON (default benchmarks/results/checkpoint_cost-<label>-<time>.json)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.model, Path(args.dir))), flush=True)
        return
    if args.model is None:
        from rlhf.models.importing import import_model

        args.model = str(import_model("smollm2-135m-instruct"))
    import rlhf

    code = str(Path(rlhf.__file__).resolve().parent.parent)
    commit = subprocess.run(["git", "-C", code, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    results = {"label": args.label, "model": args.model, "code": code,
               "commit": commit.stdout.strip() or None, "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "load_before": os.getloadavg(), "variants": {}}
    for variant in args.variants.split(","):
        with tempfile.TemporaryDirectory(prefix="ckpt-cost-") as tmp:
            env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
            proc = subprocess.run([sys.executable, __file__, "--child", variant, "--model", args.model, "--dir", tmp],
                                  env=env, capture_output=True, text=True)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                sys.exit(f"{variant} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
            results["variants"][variant] = json.loads(line.removeprefix("RESULT "))
            print(json.dumps(results["variants"][variant], indent=1), flush=True)
    results["load_after"] = os.getloadavg()
    out = Path(args.out or HERE / "results" / f"checkpoint_cost-{args.label}-{datetime.datetime.now():%Y%m%d-%H%M%S}.json")
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(out)


if __name__ == "__main__":
    main()
