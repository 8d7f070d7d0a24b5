"""CPU per prompt of chat-templating and tokenising, three ways, alternated in one process:

- per_row: `apply_chat_template` then the tokenizer, one row at a time (`chat_prompt_ids`, the reference);
- batched: one template call and one Rust `encode_batch_fast` per 1000 rows (the path before splicing);
- spliced: `chat_prompt_ids_batch` (rlhf.data.chat_splice: template rendered once per conversation shape,
  constant text tokenised once, the rest in one batched call).

    python benchmarks/prompt_tokenize.py --tokenizer ~/.cache/rlhf/models/smollm2-135m-instruct --out X.json

Rows are the GSM8K-format prompts of `data_scale.py`. All three must give the same ids (checked).
Timed by process CPU time (steadier than wall seconds on a shared machine), one thread, the
garbage collector paused as `cached_map` runs its batches; medians of --rounds alternations.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def batched(tokenizer, conversations):
    texts = tokenizer.apply_chat_template([list(c) for c in conversations], add_generation_prompt=True, tokenize=False)
    return [e.ids for e in tokenizer.backend_tokenizer.encode_batch_fast(texts, add_special_tokens=False)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default="", help="a model folder (default: the tiny test model's)")
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    import torch

    torch.set_num_threads(1)
    from rlhf.data.generators import gsm8k_like_rows
    from rlhf.data.tokenize import chat_prompt_ids, chat_prompt_ids_batch
    from rlhf.models.loading import load_tokenizer

    if args.tokenizer:
        folder = str(Path(args.tokenizer).expanduser())
    else:
        from helpers import tiny_model_path

        folder = tiny_model_path()
    tokenizer = load_tokenizer(folder)
    pool = gsm8k_like_rows(2000, seed=0)
    conversations = [[{"role": "user", "content": f"Problem {i}. {pool[i % len(pool)]['prompt'][0]['content']}"}]
                     for i in range(args.rows)]
    ways = {
        "per_row": lambda part: [chat_prompt_ids(tokenizer, c) for c in part],
        "batched": lambda part: batched(tokenizer, part),
        "spliced": lambda part: chat_prompt_ids_batch(tokenizer, part),
    }
    reference = None
    times: dict[str, list[float]] = {name: [] for name in ways}
    load_before = list(os.getloadavg())
    for _ in range(args.rounds):
        for name, way in ways.items():
            gc.disable()
            start = time.process_time()
            ids = [x for k in range(0, len(conversations), 1000) for x in way(conversations[k : k + 1000])]
            times[name].append((time.process_time() - start) / len(conversations) * 1e6)
            gc.enable()
            reference = reference or ids
            assert ids == reference, f"{name} gave other ids than per_row"
    median = {name: statistics.median(t) for name, t in times.items()}
    result = {
        "tokenizer": folder, "rows": args.rows, "rounds": args.rounds, "date": time.strftime("%Y-%m-%d %H:%M"),
        "load_average_before": load_before, "load_average_after": list(os.getloadavg()),
        "cpu_us_per_row": {name: [round(t, 1) for t in ts] for name, ts in times.items()},
        "median_cpu_us_per_row": {name: round(m, 1) for name, m in median.items()},
        "speedup_vs_per_row": {name: round(median["per_row"] / m, 2) for name, m in median.items()},
        "speedup_vs_batched": {name: round(median["batched"] / m, 2) for name, m in median.items()},
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
