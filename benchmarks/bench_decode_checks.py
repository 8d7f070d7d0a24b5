"""What checking for finished rows every k decoding steps costs or saves on this machine.

`rlhf.rollout.decode.sample` reads "has every row emitted EOS?" on the host every
`check_every` steps (1 on a CPU, 16 on an accelerator, see `default_check_every`). This
times HFEngine generation (16 prompts x 8 samples, temperature 1.0, one torch thread) with
several cadences, alternated within one process, at two random Qwen2 sizes with the byte
tokenizer: `tiny` (hidden 64, 2 layers, the CPU recipes' model) and `h256` (hidden 256,
4 layers). Random models almost never emit EOS, so every call decodes all `--new-tokens`
steps and the cadence changes only the checks, never the number of steps: this isolates the
per-step cost of a check. (Where rows do finish, a cadence k > 1 also decodes up to k - 1
steps past the last EOS: pure waste on a CPU.)

    python benchmarks/bench_decode_checks.py                   # both sizes, cadences 1 and 16
    python benchmarks/bench_decode_checks.py --cadences default --json out.json   # also runs on older trees

`default` is HFEngine's own default; run the script with PYTHONPATH pointing at another
checkout to compare trees (alternate the processes: this machine's speed drifts).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import tempfile
import time

SIZES = {"tiny": dict(hidden_size=64, num_layers=2, intermediate_size=256),
         "h256": dict(hidden_size=256, num_layers=4, intermediate_size=1024)}


def measure(size: str, cadences: list[str], new_tokens: int, reps: int) -> dict:
    import torch

    torch.set_num_threads(1)
    from rlhf.data.generators import arithmetic_rows
    from rlhf.data.prompts import PromptDataset
    from rlhf.models.loading import load_causal_lm, load_tokenizer
    from rlhf.models.tiny import tiny_qwen2
    from rlhf.rollout import HFEngine, SamplingParams

    path = tiny_qwen2(os.path.join(tempfile.gettempdir(), "rlhf-bench-models", size), **SIZES[size])
    model, tok = load_causal_lm(path).eval(), load_tokenizer(path)
    has_cadence = "check_every" in inspect.signature(HFEngine).parameters
    engines = {c: HFEngine.sharing(model, tok) if c == "default" else HFEngine.sharing(model, tok, check_every=int(c))
               for c in cadences if c == "default" or has_cadence}
    batches = PromptDataset(arithmetic_rows(16 * (reps + 1), seed=1), tok).shuffled(16, seed=1)
    sampling = SamplingParams(n=8, temperature=1.0, max_new_tokens=new_tokens)
    warm = next(batches)
    for engine in engines.values():
        engine.generate(warm, sampling)
    seconds: dict[str, list[float]] = {c: [] for c in engines}
    tokens: dict[str, list[int]] = {c: [] for c in engines}
    names = list(engines)
    for rep in range(reps):
        prompts = next(batches)
        for name in names[rep % len(names):] + names[: rep % len(names)]:  # rotate the order every repetition
            torch.manual_seed(rep)
            start = time.perf_counter()
            out = engines[name].generate(prompts, sampling)
            seconds[name].append(time.perf_counter() - start)
            tokens[name].append(out["responses"].numel())  # decoded positions, padding after EOS included
    result = {name: {"median_s": statistics.median(s), "decoded_tokens_per_s": statistics.median(
        t / x for t, x in zip(tokens[name], s))} for name, s in seconds.items()}
    if "1" in result and "16" in result:
        result["speedup_16_vs_1"] = result["1"]["median_s"] / result["16"]["median_s"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="tiny,h256")
    parser.add_argument("--cadences", default="1,16", help="check_every values; 'default' = HFEngine's own")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    results = {size: measure(size, args.cadences.split(","), args.new_tokens, args.reps)
               for size in args.sizes.split(",")}
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
