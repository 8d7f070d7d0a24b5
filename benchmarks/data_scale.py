"""How long a large prompt set takes to be ready, and how much memory: cold start, warm start, and the old path.

    python benchmarks/data_scale.py --rows 1000000            # + the old list path at 100k rows
    python benchmarks/data_scale.py --rows 100000 --baseline-rows 0
    python benchmarks/data_scale.py --tokenizer ~/.cache/rlhf/models/smollm2-135m-instruct --baseline-rows 0 \
        --out benchmarks/results/data_scale-smollm2.json      # a real tokenizer (SmolLM2's, 49k BPE)

Writes N GSM8K-format rows in verl's schema to a parquet file (each prompt ~250 characters,
~230 tokens with the tiny byte-level tokenizer, ~70 with SmolLM2's BPE), then, each in a fresh process and with one
torch thread, times `PromptDataset(load_rows(path))` up to its first shuffled batch:
- cold: an empty cache (reading, validating, templating, tokenising, writing the Arrow caches);
- warm: the same again, reading the caches (a second start, a resume, the build after preflight);
- list: the pre-Arrow path (rows read into Python lists, validated, fingerprinted, templated and
  tokenised one by one, as `PromptDataset` did before it moved onto `datasets`), at --baseline-rows.
`cpu_s` is the CPU time of the process and its workers (on a shared machine, wall seconds
depend on the other load; CPU seconds much less). Peak RSS is the process's own maximum (`ru_maxrss`) up to the first batch; `workers` is the
largest map worker's (`num_proc` processes fork from the main one, so they share its pages).
Prints one JSON object and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_rows_parquet(n: int, path: Path) -> Path:
    """`n` distinct GSM8K-format rows (the generator's problems, numbered) written in chunks."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlhf.data.generators import gsm8k_like_rows

    pool = gsm8k_like_rows(2000, seed=0)
    writer = None
    for start in range(0, n, 100_000):
        stop = min(start + 100_000, n)
        base = [pool[i % len(pool)] for i in range(start, stop)]
        table = pa.table({
            "data_source": ["openai/gsm8k"] * (stop - start),
            "prompt": [[{"role": "user", "content": f"Problem {i}. {row['prompt'][0]['content']}"}]
                       for i, row in zip(range(start, stop), base)],
            "ability": ["math"] * (stop - start),
            "reward_model": [{"style": "rule", "ground_truth": row["reward_model"]["ground_truth"]} for row in base],
            "extra_info": [{"split": "train", "index": i} for i in range(start, stop)],
        })
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    writer.close()
    return path


def child(mode: str, path: str, cache: str, num_proc: int | None, tokenizer_path: str) -> dict:
    """One measured start, in this (fresh) process: what a training process imports and does for its data
    (the tiny model's folder is found by the parent, so the test helpers' imports are not counted)."""
    import resource

    start = time.perf_counter()
    import torch

    torch.set_num_threads(1)
    from rlhf.models.loading import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path)
    imported = time.perf_counter() - start
    if mode == "list":
        batch, rows = list_path(path, tokenizer)
    else:
        from rlhf.data.prompts import PromptDataset
        from rlhf.data.sources import load_rows

        data = PromptDataset(load_rows(path, cache_dir=cache, num_proc=num_proc), tokenizer, cache_dir=cache,
                             num_proc=num_proc)
        batch, rows = next(data.shuffled(64, seed=0)), len(data)
    seconds = time.perf_counter() - start
    assert batch["input_ids"].shape[0] == 64
    me, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "seconds": round(seconds, 2),
        "cpu_s": round(me.ru_utime + me.ru_stime + workers.ru_utime + workers.ru_stime, 2),
        "import_and_tokenizer_s": round(imported, 2),
        "rows": rows,
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
        "peak_rss_workers_gb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20, 3),
    }


def list_path(path: str, tokenizer):
    """The pre-Arrow constructor's work: rows as Python lists, checked, fingerprinted, tokenised one by one."""
    from rlhf.data.files import fingerprint_rows, read_rows
    from rlhf.data.prompts import collate_prompts
    from rlhf.data.schema import validate_row
    from rlhf.data.tokenize import chat_prompt_ids, shuffled_batches

    rows, _ = read_rows(path)
    for i, row in enumerate(rows):
        validate_row(row, source="prompts", index=i)
    fingerprint_rows(rows)
    ids = [chat_prompt_ids(tokenizer, row["prompt"]) for row in rows]
    indices = next(shuffled_batches(len(rows), 64, 0))
    batch = collate_prompts([f"p-{i}" for i in indices], [rows[i] for i in indices], [ids[i] for i in indices],
                            tokenizer.pad_token_id)
    return batch, len(rows)


def measure(mode: str, path: Path, cache: Path, num_proc: int | None, tokenizer: str) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, str(path), str(cache), str(num_proc or 0), tokenizer]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(ROOT), "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{mode} run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the generated prompt set")
    parser.add_argument("--baseline-rows", type=int, default=100_000, help="rows for the old list path (0: skip)")
    parser.add_argument("--num-proc", type=int, default=None, help="map processes (default: one per core)")
    parser.add_argument("--dir", type=Path, default=None, help="working folder (default: a temporary one)")
    parser.add_argument("--tokenizer", default="", help="a model folder whose tokenizer templates and tokenises "
                        "the prompts (default: the tiny test model's byte-level one)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON object to this file")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, path, cache, num_proc, tokenizer = args.child
        print(json.dumps(child(mode, path, cache, int(num_proc) or None, tokenizer)))
        return
    work = args.dir or Path(tempfile.mkdtemp(prefix="rlhf-data-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    path = work / f"prompts-{args.rows}.parquet"
    started = time.perf_counter()
    if not path.exists():
        write_rows_parquet(args.rows, path)
    if args.tokenizer:
        tokenizer = label = str(Path(args.tokenizer).expanduser().absolute())
    else:
        sys.path.insert(0, str(ROOT / "tests"))
        from helpers import tiny_model_path

        tokenizer, label = tiny_model_path(), "tiny byte-level (tests/helpers.tiny_model_path)"
    result = {"rows": args.rows, "file_mb": round(path.stat().st_size / 2**20, 1),
              "write_s": round(time.perf_counter() - started, 1), "cores": len(os.sched_getaffinity(0)),
              "tokenizer": label, "date": time.strftime("%Y-%m-%d %H:%M"),
              "load_average_before": list(os.getloadavg())}
    cache = work / f"cache-{args.rows}-{Path(args.tokenizer).name if args.tokenizer else 'tiny'}"
    result["cold"] = measure("arrow", path, cache, args.num_proc, tokenizer)
    result["warm"] = measure("arrow", path, cache, args.num_proc, tokenizer)
    if args.baseline_rows:
        small = work / f"prompts-{args.baseline_rows}.parquet"
        if not small.exists():
            write_rows_parquet(args.baseline_rows, small)
        result["list_baseline"] = {"rows": args.baseline_rows, **measure("list", small, cache, None, tokenizer)}
    result["load_average_after"] = list(os.getloadavg())
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("\n| path | rows | seconds to first batch | of which import + tokenizer | CPU seconds | peak RSS GB | "
          "workers' peak GB |")
    print("|---|---|---|---|---|---|---|")
    for name in ("cold", "warm", "list_baseline"):
        if name in result:
            r = result[name]
            rows = r.get("rows", args.rows) if name == "list_baseline" else args.rows
            print(f"| {name} | {rows:,} | {r['seconds']} | {r['import_and_tokenizer_s']} | {r['cpu_s']} | "
                  f"{r['peak_rss_gb']} | {r['peak_rss_workers_gb']} |")


if __name__ == "__main__":
    main()
