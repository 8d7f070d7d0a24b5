"""How close generation can come to the matmul peak on this CPU: a rollout's seconds split into the decoding
steps' matmuls, their attention over the KV cache, the prompts' prefill and everything else, and the utilisation
it would reach if everything but the matmuls and the prefill (or everything but those and attention) took no time.

`grpo_vs_trl.py --model` reports generation's utilisation (model FLOPs / seconds / one thread's square-matmul
peak). A decoding step multiplies a few rows by every weight, a skinny product slower per FLOP than the square
ones the peak is measured on, so generation's utilisation has a ceiling below 100% that no change outside the
matmuls can lift. This measures it in place: the rollout of the GRPO benchmark's shape (SmolLM2, 16 random
prompts of 39 tokens x 4 samples, forced response lengths, temperature 1.0, one thread) through `HFEngine`,
with the lean decoder's matmuls (`LeanDecoder._linear`, `_head`), its attention (`LeanDecoder._attend`) and the
prefill (`rlhf.rollout.decode._prefill`) timed (a clock read around each call, about 10 ms a rollout). Each repetition is a fresh process: load, one
short warm-up rollout, one timed rollout. Benchmark instrumentation only.

    OMP_NUM_THREADS=1 python benchmarks/generation_ceiling.py --new-tokens 64 256 --repeats 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def measure(model_name: str, prompts: int, n: int, prompt_tokens: int, new_tokens: int) -> dict:
    """One timed rollout in this process: seconds in total, in the decoding matmuls and in the prefill."""
    from bench_flops import Shape, matmul_peak, rollout_flops
    from decode_revisions import random_prompt_rollout

    from rlhf.rollout import SamplingParams, decode, lean_decoder

    seconds = {"matmul": 0.0, "attention": 0.0, "prefill": 0.0}

    def timed(key: str, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[key] += time.perf_counter() - start
        return wrapper

    # the head calls F.linear itself (in vocabulary chunks) or `_linear`: time the outermost call only
    linear, head = lean_decoder.LeanDecoder._linear, lean_decoder.LeanDecoder._head
    inside_head = [False]

    def linear_timed(self, *args):
        return linear(self, *args) if inside_head[0] else timed("matmul", linear)(self, *args)

    def head_timed(self, *args):
        inside_head[0] = True
        try:
            return timed("matmul", head)(self, *args)
        finally:
            inside_head[0] = False

    lean_decoder.LeanDecoder._linear, lean_decoder.LeanDecoder._head = linear_timed, head_timed
    lean_decoder.LeanDecoder._attend = timed("attention", lean_decoder.LeanDecoder._attend)
    decode._prefill = timed("prefill", decode._prefill)

    model, engine, batch = random_prompt_rollout(model_name, prompts, prompt_tokens)
    engine.generate(batch, SamplingParams(n=n, temperature=1.0, max_new_tokens=8, min_new_tokens=8))  # warm-up
    seconds.update(matmul=0.0, attention=0.0, prefill=0.0)
    sampling = SamplingParams(n=n, temperature=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    start = time.perf_counter()
    engine.generate(batch, sampling)
    total = time.perf_counter() - start
    shape = Shape.of(model.config)
    decode_matmul_flops = prompts * n * (new_tokens - 1) * 2 * (shape.body + shape.head)
    return {
        "seconds": {"total": total, **seconds, "other": total - sum(seconds.values())},
        "gflop": rollout_flops(shape, [prompt_tokens] * prompts, n, [new_tokens] * (prompts * n)) / 1e9,
        "decode_matmul_gflop": decode_matmul_flops / 1e9,
        "matmul_peak_gflops": matmul_peak(),
    }


def summarise(runs: list[dict]) -> dict:
    """Medians over repetitions: utilisation, the matmuls' own rate, and the ceiling with no other work."""
    def med(f) -> float:
        return round(statistics.median(f(r) for r in runs), 4)

    def rng(f) -> list[float]:
        values = [f(r) for r in runs]
        return [round(min(values), 4), round(max(values), 4)]

    def utilisation(r: dict) -> float:
        return r["gflop"] / r["seconds"]["total"] / r["matmul_peak_gflops"]

    def ceiling(r: dict) -> float:
        return r["gflop"] / (r["seconds"]["matmul"] + r["seconds"]["prefill"]) / r["matmul_peak_gflops"]

    def with_attention(r: dict) -> float:
        s = r["seconds"]
        return r["gflop"] / (s["matmul"] + s["prefill"] + s.get("attention", 0.0)) / r["matmul_peak_gflops"]

    def matmul_rate(r: dict) -> float:
        return r["decode_matmul_gflop"] / r["seconds"]["matmul"] / r["matmul_peak_gflops"]

    def other_allowed_for_70(r: dict) -> float:
        return r["gflop"] / (0.7 * r["matmul_peak_gflops"]) - r["seconds"]["matmul"] - r["seconds"]["prefill"]

    return {
        "seconds": {k: med(lambda r, k=k: r["seconds"].get(k, 0.0))
                    for k in ("total", "matmul", "attention", "prefill", "other")},
        "utilisation": med(utilisation), "utilisation_range": rng(utilisation),
        "decode_matmuls_of_peak": med(matmul_rate), "decode_matmuls_of_peak_range": rng(matmul_rate),
        "ceiling_without_other_work": med(ceiling), "ceiling_range": rng(ceiling),
        "ceiling_with_attention": med(with_attention), "ceiling_with_attention_range": rng(with_attention),
        "other_seconds_allowed_for_70_percent": med(other_allowed_for_70),
        "matmul_peak_gflops": med(lambda r: r["matmul_peak_gflops"]),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="an imported model's name or a model folder")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=39)
    p.add_argument("--new-tokens", type=int, nargs="+", default=[64])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="results JSON (default: benchmarks/results/generation_ceiling-<time>.json)")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.model, args.prompts, args.n, args.prompt_tokens, args.child)))
        return 0
    started = datetime.datetime.now()
    out = Path(args.out or HERE / "results" / f"generation_ceiling-{started:%Y%m%d-%H%M%S}.json")
    result: dict = {"started": started.isoformat(timespec="seconds"), "args": vars(args),
                    "machine": f"{os.uname().machine}, {os.cpu_count()} cores, one thread", "workloads": {}}
    for tokens in args.new_tokens:
        runs = []
        for rep in range(args.repeats):
            child = [sys.executable, __file__, "--child", str(tokens), "--model", args.model, "--prompts",
                     str(args.prompts), "--n", str(args.n), "--prompt-tokens", str(args.prompt_tokens)]
            done = subprocess.run(child, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return done.returncode
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            s = runs[-1]["seconds"]
            print(f"{tokens} tokens, rep {rep}: {s['total']:.2f} s (matmuls {s['matmul']:.2f}, attention "
                  f"{s['attention']:.2f}, prefill {s['prefill']:.2f}, other {s['other']:.2f})", flush=True)
        result["workloads"][f"{args.prompts}x{args.n}/p{args.prompt_tokens}/{tokens}tok"] = {
            "runs": runs, "summary": summarise(runs)}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
    for name, w in result["workloads"].items():
        print(name, json.dumps(w["summary"]))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
