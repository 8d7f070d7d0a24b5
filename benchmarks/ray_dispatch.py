"""What one Ray call carrying a GRPO batch costs, and what the two dispatch fixes bought.

    python benchmarks/ray_dispatch.py [--rows 128] [--calls 200]

A batch the size of one GRPO step of the benchmark (128 rows, ~45 tokens: about 160 KB) is
sent to a Ray actor that returns a small batch (like `update` or `generate`), in four
set-ups, each in a fresh Ray cluster:
  torch pickle, default inline limit   the runtime before the performance pass
  numpy pickle, default inline limit   Batch.__reduce__ only
  torch pickle, 4 MiB inline limit     RayRuntime(inline_bytes) only
  numpy pickle, 4 MiB inline limit     both (RayRuntime now)
plus a no-argument call (Ray's floor). Medians of `calls` round trips, one torch thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def child(rows: int, calls: int, numpy_pickle: bool, inline: bool) -> dict:
    import torch

    torch.set_num_threads(1)
    import ray

    from rlhf.batch import Batch

    if not numpy_pickle:  # the behaviour before Batch.__reduce__: pickle the dataclass with its tensors
        del Batch.__reduce__
    config = {"max_direct_call_object_size": 4 * 2**20, "task_rpc_inlined_bytes_limit": 16 * 2**20} if inline else {}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _system_config=config)

    @ray.remote
    class Echo:
        def __init__(self):
            import torch

            torch.set_num_threads(1)

        def noop(self):
            return None

        def update(self, batch):
            return Batch({"log_probs": batch["responses"].float()})

    actor = Echo.remote()
    ray.get(actor.__ray_ready__.remote())
    t, r = 37, 8
    batch = Batch(
        {
            "input_ids": torch.randint(0, 250, (rows, t + r)),
            "attention_mask": torch.ones(rows, t + r, dtype=torch.long),
            "position_ids": torch.arange(t + r).repeat(rows, 1),
            "responses": torch.randint(0, 250, (rows, r)),
            "response_mask": torch.ones(rows, r),
            "advantages": torch.randn(rows, r),
            "ref_log_probs": torch.randn(rows, r),
        },
        {"uid": [f"u{i // 8}" for i in range(rows)]},
        {"temperature": 1.0},
    )

    def median_ms(fn) -> float:
        for _ in range(10):
            fn()
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return 1e3 * statistics.median(times)

    import pickle

    out = {
        "noop_ms": median_ms(lambda: ray.get(actor.noop.remote())),
        "batch_call_ms": median_ms(lambda: ray.get(actor.update.remote(batch))),
        "pickle_roundtrip_ms": median_ms(lambda: pickle.loads(pickle.dumps(batch, protocol=5))),
        "batch_bytes": len(pickle.dumps(batch, protocol=5)),
    }
    ray.shutdown()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.rows, args.calls, bool(args.child[0]), bool(args.child[1]))))
        return
    variants = [(0, 0, "torch pickle, default inline limit"), (1, 0, "numpy pickle, default inline limit"),
                (0, 1, "torch pickle, 4 MiB inline limit"), (1, 1, "numpy pickle, 4 MiB inline limit (now)")]
    rows = []
    for numpy_pickle, inline, name in variants:
        cmd = [sys.executable, __file__, "--rows", str(args.rows), "--calls", str(args.calls),
               "--child", str(numpy_pickle), str(inline)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        rows.append((name, json.loads(out)))
    base = rows[0][1]["batch_call_ms"]
    print(f"| set-up ({args.rows} rows, {rows[0][1]['batch_bytes'] / 1024:.0f} KB) | call with batch ms | "
          "no-arg call ms | pickle round trip ms | vs before |")
    print("|---|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['batch_call_ms']:.2f} | {r['noop_ms']:.2f} | {r['pickle_roundtrip_ms']:.2f} | "
              f"{base / r['batch_call_ms']:.1f}x |")


if __name__ == "__main__":
    main()
