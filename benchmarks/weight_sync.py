"""Weights to a rollout group: torch.distributed broadcast vs Ray's object store, between two Ray actors.

The asynchronous rollout (docs/async.md) publishes a flat snapshot of the policy's weights after each
update (`rlhf.workers.weight_sync`). This times the two transports end to end, alternated in one Ray
session: the sender packs its weights into a snapshot and hands it over, the receiver gets it and copies
it into weights of its own (what `update_weights` does), and the time until the receiver is done is
measured from the driver. Shapes are SmolLM2-135M-Instruct's (built from its config on the meta device,
filled with random values: no real-model load) and the tiny main-job model's.

- broadcast: `BroadcastSender` in the sender (gloo on CPU), `BroadcastReceiver` in the receiver;
- object store: the snapshot is the sender's call result (stays in the object store); the receiver's call
  takes its reference and reads it there.

    python benchmarks/weight_sync.py          # ~2 min

Writes benchmarks/results/weight_sync-<time>.json; prints medians and the ratio.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))

SMOLLM2 = dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True)
TINY = dict(model_type="qwen2", hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=260, tie_word_embeddings=True)


class Side:
    """One end: weights of a model shape (random), and both transports' machinery."""

    def __init__(self, config: dict, seed: int):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        torch.set_num_threads(1)
        cfg = AutoConfig.for_model(**config)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        g = torch.Generator().manual_seed(seed)
        self.weights = {n: torch.randn(p.shape, generator=g) for n, p in model.named_parameters()}
        self.sender = self.receiver = None

    def numel(self) -> int:
        return sum(t.numel() for t in self.weights.values())

    # object store
    def snapshot(self, version: int):
        from rlhf.workers.weight_sync import snapshot

        return snapshot(self.weights.items(), version, "float32", "cpu")

    def load(self, snap) -> float:
        start = time.perf_counter()
        for name, tensor in snap.named():
            self.weights[name].copy_(tensor)
        return time.perf_counter() - start

    # broadcast
    def serve(self) -> tuple[str, int]:
        import torch

        from rlhf.workers.weight_sync import BroadcastSender

        self.sender = BroadcastSender(1, torch.device("cpu"))
        return self.sender.address

    def connect(self, address) -> None:
        import torch

        from rlhf.workers.weight_sync import BroadcastReceiver

        self.receiver = BroadcastReceiver(tuple(address), 0, 1, torch.device("cpu"))

    def publish(self, version: int) -> None:
        self.sender.publish(self.snapshot(version), keep_from=version)

    def receive(self, version: int) -> float:
        return self.load(self.receiver.receive(version))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}})
    actor = ray.remote(Side)
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "load_average_start": os.getloadavg(),
              "models": {}}
    for name, config in (("tiny main job (140k)", TINY), ("SmolLM2-135M", SMOLLM2)):
        sender, receiver = actor.remote(config, 0), actor.remote(config, 1)
        numel = ray.get(sender.numel.remote())
        ray.get(receiver.connect.remote(ray.get(sender.serve.remote())))
        times = {"broadcast": [], "object_store": []}
        version = 0
        for r in range(args.repeats + 1):  # the first round warms up both paths
            for transport in (("broadcast", "object_store") if r % 2 else ("object_store", "broadcast")):
                version += 1
                start = time.perf_counter()
                if transport == "broadcast":
                    ray.get(sender.publish.remote(version))
                    ray.get(receiver.receive.remote(version))
                else:
                    ray.get(receiver.load.remote(sender.snapshot.remote(version)))
                if r:
                    times[transport].append(time.perf_counter() - start)
        medians = {k: statistics.median(v) for k, v in times.items()}
        report["models"][name] = {"parameters": numel, "megabytes": numel * 4 / 2**20, "seconds": times,
                                  "median_s": medians,
                                  "object_store_over_broadcast": medians["object_store"] / medians["broadcast"]}
        print(f"{name}: {numel * 4 / 2**20:.1f} MB fp32; broadcast {medians['broadcast']:.3f} s, object store "
              f"{medians['object_store']:.3f} s (x{medians['object_store'] / medians['broadcast']:.2f}; runs "
              f"{[round(t, 3) for t in times['broadcast']]} / {[round(t, 3) for t in times['object_store']]})",
              flush=True)
        ray.kill(sender)
        ray.kill(receiver)
    report["load_average_end"] = os.getloadavg()
    ray.shutdown()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = ROOT / "benchmarks" / "results" / f"weight_sync-{stamp}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
