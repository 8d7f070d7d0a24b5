"""Our decoder (HFEngine: rlhf.rollout.decode + lean_decoder) against transformers' own continuous batching.

transformers 5.24 ships continuous batching (`model.generate_batch`, `ContinuousBatchingConfig(return_logprobs=
True)`): a paged KV cache, a FIFO scheduler in a background thread, `num_return_sequences` forking a prompt's
prefill into n requests. If it matched our hand-written decoder we would use it and delete ours. This runs
both in one process on the same model, prompts and settings, alternated within each repetition:

- tokens/s (generated tokens over the call's wall and CPU seconds; the ratio ours / theirs with its spread);
- greedy identity: the fraction of identical responses; where they differ, the first differing position and
  the gap between the two tokens' logits there in a teacher-forced forward (near-tied or not);
- log-prob agreement: each engine's log-probs against a teacher-forced forward over its own responses
  (max |diff| over response tokens);
- utilisation: model FLOPs of the work (prefill of the distinct prompts + one decode step per generated
  token after the first; 2 x params per token, the LM head where logits are computed, attention) over the
  call's CPU seconds, over one thread's measured fp32 matmul peak (square 1024 matmuls, same process).

Lengths: `natural` (EOS ends a row, at most --max-new-tokens) and `forced` (every row decodes
--max-new-tokens: ours with min_new_tokens = max_new_tokens; transformers' continuous batching drops
`MinNewTokensLengthLogitsProcessor` as unsupported, so there EOS is disabled instead, eos_token_id -1).
Its KV cache is sized explicitly (`num_blocks`, `max_batch_tokens`): by default on a CPU it takes 60% of
the machine's RAM (a first try here reached 13.6 GB RSS).

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 nice -n 19 python benchmarks/decoder_vs_transformers.py \\
        --prompts 16 --n 4 --max-new-tokens 64 --reps 3

With these defaults it takes about 12 CPU-minutes (transformers' side is most of it); `--budget-s` stops
starting repetitions past the second once it is spent. Results: docs/rollout_engines.md.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # transformers' continuous batching decodes in a thread of its own
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from bench_flops import Shape, matmul_peak, rollout_flops  # noqa: E402

MODEL = "smollm2-135m-instruct"
CASES = ("sampled-natural", "sampled-forced", "greedy-natural")


def load(checkpoint: str, prompts: int, seed: int):
    from rlhf.data.generators import arithmetic_rows
    from rlhf.data.prompts import PromptDataset
    from rlhf.models.loading import load_causal_lm, load_tokenizer

    model, tok = load_causal_lm(checkpoint).eval(), load_tokenizer(checkpoint)
    batch = next(PromptDataset(arithmetic_rows(prompts, seed=seed), tok).shuffled(prompts, seed=seed))
    return model, tok, batch


class Ours:
    """HFEngine as the policy worker uses it (shared prefill, lean decoder step, continuous batching)."""

    name = "ours"

    def __init__(self, model, tok):
        from rlhf.rollout import HFEngine

        self.engine = HFEngine.sharing(model, tok)

    def run(self, batch, sampling, forced: bool):
        from dataclasses import replace

        sampling = replace(sampling, min_new_tokens=sampling.max_new_tokens if forced else 0)
        out = self.engine.generate(batch, sampling)
        mask = out["response_mask"].bool()
        return out["responses"], out["rollout_log_probs"], mask


class Transformers:
    """`model.generate_batch` with `ContinuousBatchingConfig(return_logprobs=True)`, its cache sized for the call."""

    name = "transformers_cb"

    def __init__(self, model, tok, eos: list[int], pad: int):
        self.model, self.eos, self.pad = model, eos, pad

    def run(self, batch, sampling, forced: bool):
        from transformers import ContinuousBatchingConfig, GenerationConfig

        from rlhf.rollout.engine import prompt_token_lists

        ids = prompt_token_lists(batch)
        rows = len(ids) * sampling.n
        forks = sampling.n
        if sampling.greedy:  # greedy refuses num_return_sequences > 1: repeat the prompts (as for vLLM)
            ids, forks = [p for p in ids for _ in range(sampling.n)], 1
        page = 256
        blocks = rows * math.ceil((max(map(len, ids)) + sampling.max_new_tokens + 1) / page) + 8
        config = GenerationConfig(
            max_new_tokens=sampling.max_new_tokens, do_sample=not sampling.greedy,
            temperature=None if sampling.greedy else sampling.temperature, top_k=0, top_p=1.0,
            num_return_sequences=forks, eos_token_id=-1 if forced else self.eos, pad_token_id=self.pad)
        cb = ContinuousBatchingConfig(return_logprobs=True, page_size=page, num_blocks=blocks,
                                      max_batch_tokens=max(1024, sum(map(len, ids)) + rows),
                                      max_requests_per_batch=rows, max_memory_percent=0.1)
        outputs = list(self.model.generate_batch(ids, generation_config=config, continuous_batching_config=cb,
                                                 warmup=False).values())
        if len(outputs) != rows:
            raise RuntimeError(f"generate_batch returned {len(outputs)} of {rows} sequences")
        width = max(len(o.generated_tokens) for o in outputs)
        responses = torch.full((rows, width), self.pad, dtype=torch.long)
        log_probs = torch.zeros((rows, width))
        mask = torch.zeros((rows, width), dtype=torch.bool)
        for i, o in enumerate(outputs):
            k = len(o.generated_tokens)
            responses[i, :k] = torch.tensor(o.generated_tokens)
            log_probs[i, :k] = torch.tensor(o.logprobs[:k])
            mask[i, :k] = True
        return responses, log_probs, mask


def teacher_forced(model, batch, n: int, responses: torch.Tensor, temperature: float, other: torch.Tensor | None = None,
                   chunk: int = 16) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A plain forward over [prompt | response], `chunk` rows at a time: (B*n, R) log-probs of `responses` at
    `temperature`, and, given `other` tokens (B*n, R), the logit of each response token minus other's there."""
    ids = batch["input_ids"].repeat_interleave(n, dim=0)
    mask = batch["attention_mask"].repeat_interleave(n, dim=0)
    r = responses.shape[1]
    log_probs, gaps = [], []
    for lo in range(0, ids.shape[0], chunk):
        part = responses[lo : lo + chunk]
        full_ids = torch.cat([ids[lo : lo + chunk], part], dim=1)
        full_mask = torch.cat([mask[lo : lo + chunk], torch.ones_like(part)], dim=1)
        with torch.no_grad():
            logits = model(input_ids=full_ids, attention_mask=full_mask, position_ids=(full_mask.cumsum(1) - 1).clamp(
                min=0), logits_to_keep=r + 1).logits[:, :-1].float()
        log_probs.append(torch.log_softmax(logits / temperature, dim=-1).gather(-1, part[..., None]).squeeze(-1))
        if other is not None:
            theirs = other[lo : lo + chunk, :r].clamp(max=logits.shape[-1] - 1)
            theirs = torch.nn.functional.pad(theirs, (0, r - theirs.shape[1]))
            gaps.append((logits.gather(-1, part[..., None]) - logits.gather(-1, theirs[..., None])).squeeze(-1))
    return torch.cat(log_probs), (torch.cat(gaps) if other is not None else None)


def greedy_identity(ours, theirs, gaps: torch.Tensor) -> dict:
    """Identical responses; where two differ, the first differing position and the logit gap of the two tokens
    there (from the teacher-forced forward over our response: near 0 means a near-tie)."""
    (a, _, ma), (b, _, mb) = ours, theirs
    same, diffs = 0, []
    for i in range(a.shape[0]):
        x, y = a[i][ma[i]].tolist(), b[i][mb[i]].tolist()
        if x == y:
            same += 1
            continue
        pos = next((j for j in range(min(len(x), len(y))) if x[j] != y[j]), min(len(x), len(y)))
        gap = float(gaps[i, pos]) if pos < min(len(x), len(y)) else None
        diffs.append({"row": i, "first_difference": pos, "logit_gap": gap, "lengths": [len(x), len(y)]})
    return {"identical_fraction": same / a.shape[0], "differences": diffs}


def timed(engine, batch, sampling, forced: bool):
    wall, cpu = time.perf_counter(), time.process_time()
    out = engine.run(batch, sampling, forced)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def run_case(case: str, engines, model, batch, args, peak: float, deadline: float) -> dict:
    from rlhf.rollout import SamplingParams

    greedy, forced = case.startswith("greedy"), case.endswith("forced")
    sampling = SamplingParams(n=args.n, temperature=0.0 if greedy else 1.0, max_new_tokens=args.max_new_tokens)
    prompt_lengths = batch["attention_mask"].sum(dim=1).tolist()
    reps: dict[str, list[dict]] = {e.name: [] for e in engines}
    first: dict[str, tuple] = {}
    for rep in range(args.reps):
        if rep >= 2 and time.monotonic() > deadline:
            break
        for engine in engines[rep % 2:] + engines[: rep % 2]:  # alternate which goes first
            torch.manual_seed(rep)
            out, wall, cpu = timed(engine, batch, sampling, forced)
            lengths = out[2].sum(dim=1).tolist()
            tokens = sum(lengths)
            flops = rollout_flops(Shape.of(model.config), prompt_lengths, args.n, lengths)
            reps[engine.name].append({"wall_s": wall, "cpu_s": cpu, "tokens": tokens, "tokens_per_s": tokens / wall,
                                      "tokens_per_cpu_s": tokens / cpu, "gflop": flops / 1e9,
                                      "utilisation": flops / cpu / 1e9 / peak})
            first.setdefault(engine.name, out)
    result = {"reps": reps}
    for name, rs in reps.items():
        result[name] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
    ratios = [o["tokens_per_cpu_s"] / t["tokens_per_cpu_s"] for o, t in zip(reps["ours"], reps["transformers_cb"])]
    wall_ratios = [o["tokens_per_s"] / t["tokens_per_s"] for o, t in zip(reps["ours"], reps["transformers_cb"])]
    result["ours_over_transformers_tokens_per_cpu_s"] = {"median": statistics.median(ratios), "min": min(ratios),
                                                         "max": max(ratios)}
    result["ours_over_transformers_tokens_per_wall_s"] = {"median": statistics.median(wall_ratios),
                                                          "min": min(wall_ratios), "max": max(wall_ratios)}
    temperature = sampling.logit_temperature
    checks = {}
    for name, (responses, log_probs, mask) in first.items():
        other = first["transformers_cb"][0] if greedy and name == "ours" else None
        ref, gaps = teacher_forced(model, batch, args.n, responses, temperature, other)
        checks[name] = {"log_prob_max_abs_diff_vs_forward": float((ref - log_probs).abs()[mask].max())}
        if other is not None:
            checks["greedy_identity"] = greedy_identity(first["ours"], first["transformers_cb"], gaps)
    result["checks"] = checks
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help=f"a model folder (default: the imported {MODEL})")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--budget-s", type=float, default=540, help="no repetition past the second starts after it")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/decoder_vs_transformers-<time>.json")
    parser.add_argument("--note", default="niced (nice -n 19) on a shared 2-core machine: ratios count, "
                                          "not absolute numbers")
    args = parser.parse_args()
    torch.set_num_threads(1)
    deadline = time.monotonic() + args.budget_s
    started = datetime.datetime.now()
    from rlhf.models.importing import model_folder

    checkpoint = args.model or model_folder(MODEL)
    model, tok, batch = load(checkpoint, args.prompts, seed=1)
    ours = Ours(model, tok)
    engines = [ours, Transformers(model, tok, ours.engine.eos_token_ids, ours.engine.pad_token_id)]
    peak = matmul_peak()
    results = {"started": started.isoformat(timespec="seconds"), "note": args.note, "args": vars(args),
               "load_average_at_start": os.getloadavg(), "versions": _versions(), "matmul_peak_gflops": [peak]}
    for case in args.cases.split(","):
        results[case] = run_case(case, engines, model, batch, args, peak, deadline)
        print(case, json.dumps({k: v for k, v in results[case].items() if k != "reps"}, indent=1), flush=True)
    results["matmul_peak_gflops"].append(matmul_peak())
    results["load_average_at_end"] = os.getloadavg()
    results["total_s"] = (datetime.datetime.now() - started).total_seconds()
    out = args.out or f"benchmarks/results/decoder_vs_transformers-{started:%Y%m%d-%H%M%S}.json"
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print("wrote", out)


def _versions() -> dict:
    import subprocess

    import transformers

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()

    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "rlhf_commit": git("rev-parse", "--short", "HEAD"), "rlhf_dirty": bool(git("status", "--porcelain"))}


if __name__ == "__main__":
    main()
