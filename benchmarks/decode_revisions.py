"""One rollout shape decoded by two source trees of rlhf, alternated: what a change to the decoder bought.

A change inside `rlhf.rollout` (the lean decoder, the sampling step) has no switch to compare it with: the
old code is gone. This runs the same generation (SmolLM2, random prompts of a fixed length, forced response
lengths, one thread) in a fresh process per measurement, importing rlhf from each `--source` folder in turn
(e.g. a `git worktree` of the previous commit beside this checkout), and records each call's seconds, the
median and spread per source, and the ratio of medians.

    git worktree add /tmp/before HEAD~1
    OMP_NUM_THREADS=1 python benchmarks/decode_revisions.py --source /tmp/before . \\
        --prompt-tokens 150 --prompts 8 --n 8 --new-tokens 32 --repeats 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def random_prompt_rollout(model_name: str, prompts: int, prompt_tokens: int):
    """(model, an HFEngine sharing it, a batch of `prompts` random prompts of `prompt_tokens` tokens), one thread:
    the rollout shape the decoding benchmarks time. `model_name`: an imported model's name or a model folder."""
    import torch

    torch.set_num_threads(1)
    from rlhf.batch import Batch
    from rlhf.data.tokenize import position_ids
    from rlhf.models.importing import model_folder
    from rlhf.models.loading import load_causal_lm, load_tokenizer
    from rlhf.rollout import HFEngine

    folder = model_name if Path(model_name).is_dir() else model_folder(model_name)
    model, tok = load_causal_lm(folder).eval(), load_tokenizer(folder)
    ids = torch.randint(3, min(30000, model.config.vocab_size), (prompts, prompt_tokens),
                        generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    batch = Batch({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids(mask)}, {})
    return model, HFEngine.sharing(model, tok), batch


def measure(model_name: str, prompt_tokens: int, prompts: int, n: int, new_tokens: int, temperature: float) -> float:
    """Seconds of one `HFEngine.generate` call after a warm-up call, in this process."""
    import time

    from rlhf.rollout import SamplingParams

    _, engine, batch = random_prompt_rollout(model_name, prompts, prompt_tokens)
    sampling = SamplingParams(n=n, temperature=temperature, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    engine.generate(batch, sampling)
    start = time.perf_counter()
    engine.generate(batch, sampling)
    return time.perf_counter() - start


def revision(source: Path) -> str:
    out = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "rlhf"], capture_output=True, text=True)
    return out.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--source", nargs=2, required=True, help="two checkouts of rlhf: before, after")
    p.add_argument("--model", default="smollm2-135m-instruct", help="an imported model's name or a model folder")
    p.add_argument("--prompt-tokens", type=int, default=150)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="results JSON (default: benchmarks/results/decode_revisions-<time>.json)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    shape = (args.prompt_tokens, args.prompts, args.n, args.new_tokens, args.temperature)
    if args.child:
        print(json.dumps({"seconds": measure(args.model, *shape)}))
        return 0
    sources = [Path(s).resolve() for s in args.source]
    seconds: list[list[float]] = [[], []]  # by position: before, after (the same folder may be given twice)
    for rep in range(args.repeats):
        for side in (0, 1) if rep % 2 == 0 else (1, 0):  # alternated: neither side always goes first
            source = sources[side]
            env = {**os.environ, "PYTHONPATH": str(source), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            cmd = [sys.executable, str(HERE / "decode_revisions.py"), "--child", "--source", *args.source,
                   "--model", args.model, "--prompt-tokens", str(args.prompt_tokens), "--prompts", str(args.prompts), "--n", str(args.n),
                   "--new-tokens", str(args.new_tokens), "--temperature", str(args.temperature)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=source, check=True)
            seconds[side].append(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])
            print(f"rep {rep} {source}: {seconds[side][-1]:.2f} s", flush=True)
    before, after = (statistics.median(t) for t in seconds)
    result = {
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "model": args.model,
        "shape": dict(zip(("prompt_tokens", "prompts", "n", "new_tokens", "temperature"), shape)),
        "load_average": os.getloadavg(),
        "sources": [{"path": str(s), "revision": revision(s), "seconds": t, "median": statistics.median(t),
                     "min": min(t), "max": max(t)} for s, t in zip(sources, seconds)],
        "after_over_before": after / before,
    }
    print(f"median {before:.2f} s -> {after:.2f} s: x{after / before:.3f}")
    out = Path(args.out) if args.out else HERE / "results" / f"decode_revisions-{datetime.datetime.now():%Y%m%d-%H%M%S}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
