"""Rollout generation alone: our HF engine's decoding loop against transformers' `generate`, same batch.

Run by `grpo_vs_trl.py` (in its own process) for each workload's model: 16 prompts x 8
samples, temperature 1.0, one torch thread. Three ways, alternated, each timed `reps` times:
- `engine`: HFEngine as the policy worker uses it (rlhf.rollout.decode: shared prefill, own loop)
- `engine_generate`: HFEngine(use_generate=True): `generate` with output_logits for the log-probs
- `generate`: plain `model.generate` with the prompts repeated 8 times (what TRL calls), no logits kept
Decoding stops when every row has emitted EOS, in all three, so each timing is divided by
the number of generated tokens of that call (tokens/s) as well.
"""

from __future__ import annotations

import statistics
import time


def measure(checkpoint: str, max_new_tokens: int, full_length: bool = False, reps: int = 7) -> dict:
    import torch

    torch.set_num_threads(1)
    from transformers import GenerationConfig

    from rlhf.data.generators import arithmetic_rows
    from rlhf.data.prompts import PromptDataset
    from rlhf.models.loading import load_causal_lm, load_tokenizer
    from rlhf.rollout import HFEngine, SamplingParams

    model, tok = load_causal_lm(checkpoint).eval(), load_tokenizer(checkpoint)
    data = PromptDataset(arithmetic_rows(16 * (reps + 1), seed=1), tok)
    batches = data.shuffled(16, seed=1)
    min_new_tokens = max_new_tokens if full_length else 0
    sampling = SamplingParams(n=8, temperature=1.0, max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens)
    engine, engine_generate = HFEngine.sharing(model, tok), HFEngine.sharing(model, tok, use_generate=True)
    config = GenerationConfig(max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens or None, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                              eos_token_id=engine.eos_token_ids, pad_token_id=engine.pad_token_id, use_cache=True)

    def plain_generate(prompts):
        repeated = prompts.repeat(8, interleave=True)
        with torch.no_grad():
            out = model.generate(input_ids=repeated["input_ids"], attention_mask=repeated["attention_mask"],
                                 generation_config=config)
        completions = out[:, repeated["input_ids"].shape[1]:]
        return int((completions != engine.pad_token_id).sum())

    ways = {
        "engine": lambda p: int(engine.generate(p, sampling)["response_mask"].sum()),
        "engine_generate": lambda p: int(engine_generate.generate(p, sampling)["response_mask"].sum()),
        "generate": plain_generate,
    }
    seconds: dict[str, list[float]] = {k: [] for k in ways}
    tok_s: dict[str, list[float]] = {k: [] for k in ways}
    warm = next(batches)
    for fn in ways.values():
        fn(warm)
    for rep in range(reps):
        prompts = next(batches)
        names = list(ways)[rep % 3:] + list(ways)[: rep % 3]
        for name in names:
            torch.manual_seed(rep)
            start = time.perf_counter()
            tokens = ways[name](prompts)
            elapsed = time.perf_counter() - start
            seconds[name].append(elapsed)
            tok_s[name].append(tokens / elapsed)
    out = {name: {"median_s": statistics.median(s), "min_s": min(s), "median_tokens_per_s": statistics.median(tok_s[name])}
           for name, s in seconds.items()}
    out["speedup_vs_generate"] = out["generate"]["median_s"] / out["engine"]["median_s"]
    out["speedup_vs_engine_generate"] = out["engine_generate"]["median_s"] / out["engine"]["median_s"]
    return out
