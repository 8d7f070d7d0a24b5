"""Micro-batches by rows vs by tokens vs packed, and rank balancing: what each saves on ragged lengths.

Forward + backward of the response log-probs over one batch with ragged lengths (prompts and
responses drawn uniformly from the ranges below, GRPO groups sharing a prompt), on a tiny Qwen2
built locally, one thread, the three ways alternating per repetition, medians reported:

  rows:   `batch.split(micro_batch_size)`: every micro-batch padded to the batch's P + R
  tokens: `split_by_tokens(batch, micro_batch_size * (P + R))`: the same padded-size ceiling,
          rows grouped by length, each micro-batch trimmed
  tokens_rows: the same with `keep_groups=False`: rows placed by length alone, a GRPO group
          may be split (what a shared-prompt forward would then encode more than once)
  packed: the token micro-batches, each packed into one row (`pack`), no padding at all

`--balance` instead measures the partitions of rows over ranks (rlhf.workers.balance):
max rank tokens / mean - 1 for contiguous shards, greedy LPT and Karmarkar-Karp over rows, and
Karmarkar-Karp over whole groups of 8 rows (what `balanced_shards` does when groups divide evenly).

    PYTHONPATH=. python benchmarks/micro_batching.py            # ~3-5 min on one core
    PYTHONPATH=. python benchmarks/micro_batching.py --balance  # ~1 s
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np
import torch

from rlhf.algos import log_probs_from_logits
from rlhf.batch import Batch
from rlhf.models.loading import load_causal_lm
from rlhf.models.tiny import tiny_qwen2
from rlhf.rollout.hf_engine import position_ids_from_mask
from rlhf.workers.balance import balanced_shards, greedy_partition, imbalance, karmarkar_karp
from rlhf.workers.micro_batches import pack, packed_logits, split_by_tokens
from rlhf.workers.policy import response_log_probs


def ragged_rollout(prompts: int, n: int, prompt_range: tuple[int, int], response_range: tuple[int, int],
                   vocab: int, seed: int = 0) -> Batch:
    """A rollout-layout batch: `prompts` x `n` rows, left-padded prompts, right-padded responses."""
    rng = np.random.default_rng(seed)
    p_lens = rng.integers(prompt_range[0], prompt_range[1] + 1, prompts)
    r_lens = rng.integers(response_range[0], response_range[1] + 1, prompts * n)
    b, p, r = prompts * n, int(p_lens.max()), int(r_lens.max())
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(b, p + r, dtype=torch.long)
    mask = torch.zeros(b, p + r, dtype=torch.long)
    for u, pl in enumerate(p_lens):
        prompt = torch.randint(3, vocab, (int(pl),), generator=g)
        for i in range(u * n, (u + 1) * n):
            ids[i, p - pl : p], mask[i, p - pl : p] = prompt, 1
    for i, rl in enumerate(r_lens):
        ids[i, p : p + rl], mask[i, p : p + rl] = torch.randint(3, vocab, (int(rl),), generator=g), 1
    return Batch(
        {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids_from_mask(mask),
         "prompts": ids[:, :p], "responses": ids[:, p:], "response_mask": mask[:, p:]},
        {"uid": [f"u{i // n}" for i in range(b)]},
    )


def step_padded(model: torch.nn.Module, parts: list[Batch]) -> None:
    for micro in parts:
        log_probs, _ = response_log_probs(model, micro, 1.0)
        (log_probs * micro["response_mask"]).sum().backward()


def step_packed(model: torch.nn.Module, packs: list) -> None:
    for packed in packs:
        log_probs = log_probs_from_logits(packed_logits(model, packed)[None].float(), packed.targets[None])
        log_probs.sum().backward()


def bench_micro_batches(args: argparse.Namespace) -> dict:
    torch.set_num_threads(1)
    path = tiny_qwen2(os.path.join(tempfile.gettempdir(), f"rlhf-bench-mb-h{args.hidden}-l{args.layers}"),
                      hidden_size=args.hidden, num_layers=args.layers, num_heads=4, num_kv_heads=2,
                      intermediate_size=4 * args.hidden, max_position_embeddings=1024)
    model = load_causal_lm(path).train()
    batch = ragged_rollout(args.prompts, args.n, tuple(args.prompt_range), tuple(args.response_range),
                           model.config.vocab_size, seed=args.seed)
    width = batch["input_ids"].shape[1]
    budget = args.micro_batch_size * width
    rows = batch.split(args.micro_batch_size)
    split = split_by_tokens(batch, budget)
    free = split_by_tokens(batch, budget, keep_groups=False)
    packs = [pack(micro) for micro in split.parts]
    runs = {"rows": lambda: step_padded(model, rows), "tokens": lambda: step_padded(model, split.parts),
            "tokens_rows": lambda: step_padded(model, free.parts), "packed": lambda: step_packed(model, packs)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for rep in range(args.reps + 1):  # repetition 0 warms up and is dropped
        for name, run in runs.items():  # alternating, so drift on a shared machine hits all three alike
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            run()
            if rep:
                times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    real = int(batch["attention_mask"].sum())
    return {
        "shape": {"rows": len(batch), "P+R": width, "real_tokens": real, "micro_batch_size": args.micro_batch_size,
                  "max_tokens": budget, "hidden": args.hidden, "layers": args.layers},
        "micro_batches": {"rows": len(rows), "tokens": len(split.parts), "tokens_rows": len(free.parts),
                          "packed": len(packs)},
        "padded_tokens": {"rows": sum(p["input_ids"].numel() for p in rows),
                          "tokens": sum(p["input_ids"].numel() for p in split.parts),
                          "tokens_rows": sum(p["input_ids"].numel() for p in free.parts), "packed": real},
        "median_s": med,
        "all_s": times,
        "ratio_vs_rows": {k: v / med["rows"] for k, v in med.items()},
        # per repetition (the runs of one repetition are adjacent in time), then the median
        "paired_ratio_vs_rows": {k: statistics.median(a / r for a, r in zip(v, times["rows"])) for k, v in times.items()},
    }


def bench_balance(seed: int = 0, trials: int = 200) -> dict:
    """Imbalance (max rank tokens / mean - 1) of contiguous shards, greedy LPT and Karmarkar-Karp."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, b in ((2, 64), (4, 256), (8, 256), (8, 512)):
        rows = {"contiguous": [], "greedy": [], "karmarkar_karp": [], "karmarkar_karp_whole_groups": []}
        units = [np.arange(i, i + 8) for i in range(0, b, 8)]
        for _ in range(trials):
            tokens = np.repeat(rng.integers(20, 201, b // 8), 8) + rng.integers(5, 301, b)  # groups of 8 samples
            rows["contiguous"].append(imbalance(tokens, np.array_split(np.arange(b), k)))
            rows["greedy"].append(imbalance(tokens, greedy_partition(tokens, k)))
            rows["karmarkar_karp"].append(imbalance(tokens, karmarkar_karp(tokens, k)))
            rows["karmarkar_karp_whole_groups"].append(imbalance(tokens, balanced_shards(tokens, k, units)))
        out[f"{k} ranks x {b // k} rows"] = {m: {"mean": float(np.mean(v)), "max": float(np.max(v))}
                                            for m, v in rows.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--balance", action="store_true", help="measure rank partitions instead")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (rows of a group)")
    parser.add_argument("--prompt-range", type=int, nargs=2, default=(20, 200))
    parser.add_argument("--response-range", type=int, nargs=2, default=(5, 300))
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    result = bench_balance(args.seed) if args.balance else bench_micro_batches(args)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
