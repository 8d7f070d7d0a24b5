"""What the weight-sync check adds to a sync: `update_weights` alone vs with `SyncCheck` (tap + verify).

The engine is the transformers engine with its own copy of the weights (synced like vLLM); the
actor is a float32 copy of the same model. A and B alternate, medians of `--repeats` pairs.

    python benchmarks/sync_check.py --model smollm2-135m-instruct \\
        --json benchmarks/results/sync_check-smollm2-DATE.json      # the real model (needs its slot)
    python benchmarks/sync_check.py                           # the tiny test model
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="a model folder or known name (default: the tiny test model)")
    parser.add_argument("--dtype", default="bfloat16", help="the engine's storage dtype")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)

    from rlhf.models.loading import load_causal_lm
    from rlhf.rollout import HFEngine
    from rlhf.rollout.engine import SyncCheck, named_weights

    if args.model is None:
        from rlhf.models.tiny import tiny_qwen2

        path = tiny_qwen2("/tmp/rlhf-bench-models/sync-h64-l2", hidden_size=64, num_layers=2, intermediate_size=256)
    else:
        from rlhf.models.importing import import_model

        path = str(import_model(args.model))
    actor = load_causal_lm(path)
    engine = HFEngine(path, dtype=args.dtype)

    def plain() -> None:
        engine.update_weights(named_weights(actor))

    def checked() -> None:
        check = SyncCheck()
        engine.update_weights(check.tap(named_weights(actor)))
        check.verify(engine)

    times: dict[str, list[float]] = {"plain": [], "checked": []}
    plain(), checked()  # warm-up
    for _ in range(args.repeats):
        for name, fn in (("plain", plain), ("checked", checked)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    ratios = [c / p for p, c in zip(times["plain"], times["checked"])]
    result = {
        "benchmark": "sync_check",
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "load_average": os.getloadavg(),
        "model": path,
        "parameters": sum(p.numel() for p in actor.parameters()),
        "engine_dtype": args.dtype,
        "repeats": args.repeats,
        "plain_s_median": statistics.median(times["plain"]),
        "checked_s_median": statistics.median(times["checked"]),
        "ratio_median": statistics.median(ratios),
        "ratio_min_max": [min(ratios), max(ratios)],
        "times": times,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "times"}, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
