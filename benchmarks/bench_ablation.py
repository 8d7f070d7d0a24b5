"""What each change of the performance pass bought, measured alone, in one process, alternating.

    python benchmarks/bench_ablation.py                 # every model of grpo_vs_trl.py (SFT checkpoints cached)
    python benchmarks/bench_ablation.py --reps 5 --sizes tiny

Generation (16 prompts x 8 samples, temperature 1), cumulative variants:
  generate         HFEngine(use_generate=True): transformers' `generate` + output_logits (the engine before)
  loop             our decoding loop on the 128 repeated prompts (n=1), torch.multinomial draws
  loop+prefill     the 16 distinct prompts prefilled once, KV cache repeated 8x
  loop+prefill+cdf the draw by inverting the CDF (one uniform per row)
  +lean            decoding steps through rlhf.rollout.lean_decoder (static KV cache, fused projections) = HFEngine now
Log-probs (PolicyWorker(shared_prefix=...)), on a generated batch:
  full / shared    forward (reference log-probs) and forward+backward (update) over [prompt|response]
                   rows vs rlhf.models.shared_prefix (each prompt once)
Medians (and minima) over `reps` alternated repetitions, one torch thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _multinomial(probs):
    import torch

    return torch.multinomial(probs, num_samples=1).squeeze(1)


def ablate(checkpoint: str, max_new_tokens: int, full_length: bool, reps: int) -> dict:
    import torch

    torch.set_num_threads(1)
    import rlhf.rollout.decode as decode
    from rlhf.algos import log_probs_from_logits
    from rlhf.data.generators import arithmetic_rows
    from rlhf.data.prompts import PromptDataset
    from rlhf.models.loading import load_causal_lm, load_tokenizer
    from rlhf.models.shared_prefix import response_logits
    from rlhf.rollout import HFEngine, SamplingParams

    model, tok = load_causal_lm(checkpoint), load_tokenizer(checkpoint)
    model.eval()
    prompts = next(PromptDataset(arithmetic_rows(64, seed=2), tok).shuffled(16, seed=2))
    sampling = SamplingParams(n=8, temperature=1.0, max_new_tokens=max_new_tokens,
                              min_new_tokens=max_new_tokens if full_length else 0)
    engine, reference = HFEngine.sharing(model, tok), HFEngine.sharing(model, tok, use_generate=True)
    repeated = prompts.repeat(8, interleave=True)
    inverse_cdf = decode.draw

    def loop(prefill_once: bool, cdf: bool, lean: bool = False):
        def run():
            decode.draw = inverse_cdf if cdf else _multinomial
            try:
                src, n = (prompts, 8) if prefill_once else (repeated, 1)
                return decode.sample(model, src["input_ids"], src["attention_mask"], n=n,
                                     max_new_tokens=max_new_tokens, eos_token_ids=engine.eos_token_ids,
                                     pad_token_id=engine.pad_token_id, min_new_tokens=sampling.min_new_tokens,
                                     lean=lean)
            finally:
                decode.draw = inverse_cdf
        return run

    gen_variants = {
        "generate": lambda: reference.generate(prompts, sampling),
        "loop": loop(False, False),
        "loop+prefill": loop(True, False),
        "loop+prefill+cdf": loop(True, True),
        "loop+prefill+cdf+lean": loop(True, True, True),
    }
    torch.manual_seed(0)
    batch = engine.generate(prompts, sampling)
    r = batch["responses"].shape[1]
    mask = batch["response_mask"]
    model.train()

    def full_logits():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=batch["position_ids"], logits_to_keep=r + 1, use_cache=False)
        return out.logits[:, :-1]

    def shared_logits():
        return response_logits(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], r)

    def fwd(logits_fn):
        def run():
            with torch.no_grad():
                log_probs_from_logits(logits_fn().float(), batch["responses"])
        return run

    def fwd_bwd(logits_fn):
        def run():
            model.zero_grad(set_to_none=True)
            (log_probs_from_logits(logits_fn().float(), batch["responses"]) * mask).sum().backward()
        return run

    lp_variants = {
        "forward_full": fwd(full_logits), "forward_shared": fwd(shared_logits),
        "forward_backward_full": fwd_bwd(full_logits), "forward_backward_shared": fwd_bwd(shared_logits),
    }
    results: dict[str, dict] = {}
    for group, variants, train in (("generation", gen_variants, False), ("log_probs", lp_variants, True)):
        model.train(train)
        times: dict[str, list[float]] = {k: [] for k in variants}
        for fn in variants.values():  # warm-up
            fn()
        for rep in range(reps):
            names = list(variants)
            names = names[rep % len(names):] + names[: rep % len(names)]
            for name in names:
                torch.manual_seed(rep)
                start = time.perf_counter()
                variants[name]()
                times[name].append(time.perf_counter() - start)
        results[group] = {k: {"median_s": statistics.median(v), "min_s": min(v)} for k, v in times.items()}
    model.zero_grad(set_to_none=True)
    results["response_width"] = r
    return results


def main(argv=None) -> None:
    from bench_procs import load_average, machine_info
    from bench_workloads import SIZES, sft_checkpoint

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--sizes", nargs="*", default=["tiny/8", "tiny/64-full", "5m/8"])
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    machine = machine_info(HERE.parent)
    out = {"machine": machine, "results": {}}
    for spec in args.sizes:
        size, tokens = spec.split("/")
        tokens, _, full = tokens.partition("-")
        checkpoint = sft_checkpoint(SIZES[size])["checkpoint"]
        res = ablate(checkpoint, int(tokens), full == "full", args.reps)
        out["results"][spec] = res
        print(f"\n{spec} (response width {res['response_width']}), load {load_average()[0]}")
        for group in ("generation", "log_probs"):
            for name, t in res[group].items():
                print(f"  {group:10s} {name:24s} median {t['median_s']:.4f} s   min {t['min_s']:.4f} s")
    machine["load_average_at_end"] = load_average()
    path = Path(args.out) if args.out else HERE / "results" / f"ablation-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
