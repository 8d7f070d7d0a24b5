"""One GRPO step on one device: rlhf against TRL's GRPOTrainer and a plain-PyTorch floor.

    python benchmarks/gpu_step.py                 # GPU: Qwen2.5-0.5B-shaped random model, the measured shape
    python benchmarks/gpu_step.py --proxy         # CPU, about a minute: the proxies below; exit 1 on a miss
    python benchmarks/gpu_step.py --shape tiny    # the GPU harness end to end on whatever device (smoke)
    python benchmarks/gpu_step.py --frameworks trl-vllm,rlhf-vllm   # both with a colocated vLLM engine
                                                  # (TRL: use_vllm=True, vllm_mode="colocate"); issue 15's
                                                  # target is a full step <= 2.5 s on an H100

Work (GPU default, as measured in issue 13): a Qwen2.5-0.5B-shaped random model built locally
(hidden 896, 24 layers, 14 heads, 2 KV heads, vocabulary 151,936, tied embeddings, byte-level
tokenizer), 32 prompts x 8 samples, ~220-token prompts, 256 new tokens forced (EOS masked),
k3 KL loss 0.001 to a reference copy, PPO clip 0.2, AdamW lr 1e-6, micro-batch 32 rows, bf16
compute. Each framework runs in a fresh process (peak memory measured cleanly), one warm-up
step, then the median of `--steps` steps; per-phase seconds, generated tokens/s, peak GPU
memory and the ratios to TRL, as a table and JSON (benchmarks/results/).

`--proxy` measures on a CPU what makes the GPU step slow, for one policy update (Qwen's
vocabulary on a 2-layer hidden-64 body, 16 rows x R response tokens, micro-batch 4, bf16
compute), against a plain-PyTorch update doing the same work (reference forward, per-micro
forward/backward with cross-entropy log-probs, PPO-clip + k3 KL, AdamW):
  - aten ops dispatched, ours / reference, at R = 32 and 128 (target <= 1.5x: launches on a GPU),
    with the configuration a GPU run has (shared-prompt forwards off; also reported on);
  - the largest float32 temporary (not a parameter, gradient or optimizer state) relative to one
    micro-batch's logits (target <= 1/4);
  - the fraction of weights one AdamW step at lr 1e-6 changes (target >= 90%: fp32 masters).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

VOCAB = 151_936  # Qwen2.5's vocabulary
LR = 1e-6
KL_COEF = 0.001
CLIP = 0.2
VLLM_MEMORY = 0.35  # GPU fraction a colocated vLLM engine takes (both frameworks): the actor and AdamW need the rest
TARGETS = {"op_ratio_max": 1.5, "fp32_temp_fraction_max": 0.25, "changed_fraction_min": 0.90}


@dataclasses.dataclass(frozen=True)
class Shape:
    """A model body and a step's work."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    prompts: int  # distinct prompts per step
    n: int  # samples per prompt
    prompt_len: int
    new_tokens: int  # forced: EOS is masked until then
    micro_batch: int  # rows per forward/backward
    vocab: int | None = VOCAB  # None: the byte tokenizer's 259


SHAPES = {
    "qwen0.5b": Shape(896, 24, 14, 2, 4864, prompts=32, n=8, prompt_len=220, new_tokens=256, micro_batch=32),
    "tiny": Shape(64, 2, 2, 1, 256, prompts=4, n=4, prompt_len=24, new_tokens=16, micro_batch=8, vocab=None),
}
PROXY = Shape(64, 2, 2, 1, 256, prompts=2, n=8, prompt_len=16, new_tokens=128, micro_batch=4)


def build_model(shape: Shape, root: str) -> str:
    """The shape's random Qwen2 model + byte-level tokenizer, written once under `root`."""
    from rlhf.models.tiny import tiny_qwen2

    name = f"qwen2-h{shape.hidden}-l{shape.layers}-v{shape.vocab}"
    return tiny_qwen2(os.path.join(root, name), hidden_size=shape.hidden, num_layers=shape.layers,
                      num_heads=shape.heads, num_kv_heads=shape.kv_heads, intermediate_size=shape.intermediate,
                      max_position_embeddings=max(512, shape.prompt_len + shape.new_tokens + 8), vocab_size=shape.vocab)


def objective():
    from rlhf.algos import KLLoss, PPOClipLoss, kl_k3
    from rlhf.workers.objectives import PolicyObjective

    return PolicyObjective(policy_loss=PPOClipLoss(clip_low=CLIP, clip_high=CLIP),
                           kl_loss=KLLoss(estimator=kl_k3, coef=KL_COEF))


def policy_worker(path: str, shape: Shape, shared_prefix: bool = False, fused_lm_head: bool = True, **kw):
    """Our policy worker as a GPU run configures it: `fused_lm_head` on (the GPU default: no (B,T,V)
    logits), `shared_prefix` off (the default strategy on GPUs is FSDP, which turns it off: it runs
    the model in two passes, the distinct prompts then the responses against their cached keys and
    values, trading ~2x the kernel launches for fewer FLOPs). The proxy also reports the CPU defaults."""
    from rlhf.workers.policy import PolicyWorker
    from rlhf.workers.training import TrainingSetup

    training = TrainingSetup(strategy="ddp", compute_dtype="bfloat16", micro_batch_size=shape.micro_batch)
    worker = PolicyWorker(path, objective=objective(), ref_model_path=path, training=training,
                          optimizer=lambda p: torch.optim.AdamW(p, lr=LR),
                          shared_prefix=shared_prefix, fused_lm_head=fused_lm_head, **kw)
    if worker.trainer.device.type != "cuda" and fused_lm_head:  # the CPU proxy: the head as a GPU runs it,
        worker.keep_logits = False  # recomputing the logits in backward (a CPU keeps them: PolicyWorker)
    return worker


def prompt_batch(shape: Shape, seed: int = 0):
    """`prompts` random byte-token prompts of `prompt_len` tokens (no padding), one uid each."""
    from rlhf.batch import Batch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 250, (shape.prompts, shape.prompt_len), generator=g)
    batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                  non_tensors={"uid": [f"p{i}" for i in range(shape.prompts)]})
    return batch


def rollout_batch(shape: Shape, seed: int = 0):
    """A generated-looking batch (GRPO layout: n adjacent rows per prompt, full-length responses)
    with group-normalised random advantages, built without generating (for the proxy)."""
    from rlhf.rollout.hf_engine import position_ids_from_mask

    g = torch.Generator().manual_seed(seed)
    batch = prompt_batch(shape, seed).repeat(shape.n, interleave=True)
    responses = torch.randint(3, 250, (len(batch), shape.new_tokens), generator=g)
    mask = torch.ones_like(responses)
    full = torch.cat([batch["attention_mask"], mask], 1)
    batch["input_ids"] = torch.cat([batch["input_ids"], responses], 1)
    batch["attention_mask"], batch["position_ids"] = full, position_ids_from_mask(full)
    batch["responses"], batch["response_mask"] = responses, mask
    batch["advantages"] = with_advantages(len(batch), shape.n, g)[:, None] * mask
    batch.meta["temperature"], batch.meta["max_new_tokens"] = 1.0, shape.new_tokens  # what a rollout records
    return batch


def with_advantages(rows: int, n: int, g: torch.Generator) -> torch.Tensor:
    scores = torch.rand(rows, generator=g).view(-1, n)
    return ((scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-6)).view(-1)


# --------------------------------------------------------------------------- the floor
def plain_update(model, ref_model, batch, micro_batch: int, optimizer, device) -> None:
    """The same update in plain PyTorch: the floor our update is held to (same math, no framework)."""
    b = batch.to(device)
    r = b["responses"].shape[1]
    mask = b["response_mask"].float()
    num_tokens = mask.sum()

    def log_probs(m, ids, am, pos, lab):
        logits = m(input_ids=ids, attention_mask=am, position_ids=pos, logits_to_keep=r + 1).logits[:, :-1]
        return -F.cross_entropy(logits.flatten(0, 1).float(), lab.flatten(), reduction="none").view(lab.shape)

    rows = range(0, len(b), micro_batch)
    cols = ("input_ids", "attention_mask", "position_ids", "responses")
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
        ref = torch.cat([log_probs(ref_model, *(b[k][i:i + micro_batch] for k in cols)) for i in rows])
    optimizer.zero_grad(set_to_none=True)
    for i in rows:
        sl = slice(i, i + micro_batch)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            lp = log_probs(model, *(b[k][sl] for k in cols))
        ratio = torch.exp(lp - lp.detach())
        adv = b["advantages"][sl]
        pg = -torch.min(ratio * adv, ratio.clamp(1 - CLIP, 1 + CLIP) * adv)
        delta = ref[sl] - lp
        kl = torch.exp(delta) - delta - 1
        loss = ((pg + KL_COEF * kl) * mask[sl]).sum() / num_tokens
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


# --------------------------------------------------------------------------- proxy (CPU)
class OpCounter(TorchDispatchMode):
    """Counts aten ops and the largest float32 / logits-shaped outputs not shaped like a parameter
    (or its transpose: weights, gradients, optimizer state and their views are not temporaries)."""

    def __init__(self, param_shapes: set[tuple[int, ...]], vocab: int):
        super().__init__()
        self.ops = 0
        self.largest_fp32 = 0
        self.largest_logits = 0  # elements of the largest (..., V) tensor of any dtype: the logits' memory
        self.param_shapes = param_shapes
        self.vocab = vocab

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) in self.param_shapes:
                continue
            if t.dtype == torch.float32:
                self.largest_fp32 = max(self.largest_fp32, t.numel())
            if t.dim() and t.shape[-1] == self.vocab:
                self.largest_logits = max(self.largest_logits, t.numel())
        return out


def proxy_update(path: str, shape: Shape, block_elements: int, gpu_defaults: bool = True) -> dict:
    """Ops and float32 temporaries of one policy update, ours (PolicyWorker.update) vs the floor,
    and the fraction of weights our update changed. Both count their first update (optimizer
    state initialisation included on both sides)."""
    from rlhf.models.loading import load_causal_lm

    batch = rollout_batch(shape)
    worker = policy_worker(path, shape, shared_prefix=not gpu_defaults, fused_lm_head=gpu_defaults,
                           logits_block_elements=block_elements)
    shapes = {s for p in worker.trainer.unwrapped().parameters() for s in (tuple(p.shape), tuple(p.shape)[::-1])}
    before = {k: v.clone() for k, v in worker.trainer.unwrapped().state_dict().items()}
    with OpCounter(shapes, shape.vocab) as ours:
        worker.update(batch)
    after = worker.trainer.unwrapped().state_dict()
    changed = sum(int((before[k] != after[k]).sum()) for k in before) / sum(v.numel() for v in before.values())
    model = load_causal_lm(path, "float32")
    ref = load_causal_lm(path, "bfloat16").eval()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    with OpCounter(shapes, shape.vocab) as floor:
        plain_update(model, ref, batch, shape.micro_batch, opt, torch.device("cpu"))
    micro_logits = shape.micro_batch * shape.new_tokens * shape.vocab
    return {"response_tokens": shape.new_tokens, "vocab": shape.vocab, "defaults": "gpu" if gpu_defaults else "cpu",
            "logits_fraction_ours": ours.largest_logits / micro_logits,
            "logits_fraction_reference": floor.largest_logits / micro_logits,
            "ops_ours": ours.ops,
            "ops_reference": floor.ops, "op_ratio": ours.ops / floor.ops, "largest_fp32_ours": ours.largest_fp32,
            "largest_fp32_reference": floor.largest_fp32, "micro_batch_logits": micro_logits,
            "fp32_temp_fraction": ours.largest_fp32 / micro_logits, "changed_fraction": changed}


def run_proxy(root: str, response_tokens=(32, 128), vocab_scale: int = 16, with_cpu_defaults: bool = True) -> dict:
    """The proxies at Qwen's vocabulary divided by `vocab_scale`, with the log-prob memory budget
    divided by the same factor (see `main`'s --vocab-scale: the counts do not change)."""
    from rlhf.algos.logprobs import MAX_BLOCK_ELEMENTS

    torch.set_num_threads(1)
    shape = dataclasses.replace(PROXY, vocab=VOCAB // vocab_scale)
    path = build_model(shape, root)
    budget = MAX_BLOCK_ELEMENTS // vocab_scale
    rows = [proxy_update(path, dataclasses.replace(shape, new_tokens=r), budget) for r in response_tokens]
    shared = (proxy_update(path, dataclasses.replace(shape, new_tokens=response_tokens[-1]), budget, gpu_defaults=False)
              if with_cpu_defaults else None)
    largest = max(rows, key=lambda r: r["response_tokens"])
    checks = {
        **{f"op_ratio@{r['response_tokens']}": (r["op_ratio"], r["op_ratio"] <= TARGETS["op_ratio_max"]) for r in rows},
        f"fp32_temp_fraction@{largest['response_tokens']}":
            (largest["fp32_temp_fraction"], largest["fp32_temp_fraction"] <= TARGETS["fp32_temp_fraction_max"]),
        "changed_fraction": (rows[0]["changed_fraction"], rows[0]["changed_fraction"] >= TARGETS["changed_fraction_min"]),
    }
    return {"rows": rows, "cpu_defaults_row": shared, "vocab_scale": vocab_scale, "changed_fraction": rows[0]["changed_fraction"],
            "checks": checks, "targets": TARGETS, "ok": all(ok for _, ok in checks.values())}


def print_proxy(result: dict) -> None:
    print(f"{'R':>4} {'defaults':>8} {'ops ours':>9} {'ops ref':>8} {'ratio':>6} {'fp32 temp':>10} "
          f"{'logits-shaped ours/ref':>23}   (sizes relative to one micro-batch's logits)")
    for r in [*result["rows"], *filter(None, [result["cpu_defaults_row"]])]:
        print(f"{r['response_tokens']:>4} {r['defaults']:>8} {r['ops_ours']:>9} {r['ops_reference']:>8} "
              f"{r['op_ratio']:>6.2f} {r['fp32_temp_fraction']:>10.3f} "
              f"{r['logits_fraction_ours']:>11.3f}/{r['logits_fraction_reference']:.3f}")
    print(f"vocabulary {result['rows'][0]['vocab']} (Qwen's / {result['vocab_scale']}, budget scaled alike); "
          f"weights changed by one AdamW step at lr {LR:g}: {result['changed_fraction']:.2%}")
    for name, (value, ok) in result["checks"].items():
        print(f"  {'ok  ' if ok else 'MISS'} {name} = {value:.3f}")


# --------------------------------------------------------------------------- full step (GPU)
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None


def run_rlhf(path: str, shape: Shape, steps: int, device: torch.device, shared_prefix: bool = False,
             vllm: bool = False) -> dict:
    """Our policy worker: the transformers engine sharing the actor, or (`vllm`) a colocated vLLM
    engine fed the actor's weights after every update (sleeping during the update on GPUs)."""
    from rlhf.rollout.sampling import SamplingParams

    engine = {}
    if vllm:
        from rlhf.rollout.vllm_engine import VLLMEngine

        engine["engine"] = functools.partial(
            VLLMEngine, dtype="bfloat16" if device.type == "cuda" else "float32", gpu_memory_utilization=VLLM_MEMORY,
            max_model_len=shape.prompt_len + shape.new_tokens)
    worker = policy_worker(path, shape, shared_prefix=shared_prefix, **engine)
    sampling = SamplingParams(n=shape.n, temperature=1.0, max_new_tokens=shape.new_tokens,
                              min_new_tokens=shape.new_tokens)
    g = torch.Generator().manual_seed(0)
    records = []
    for step in range(steps + 1):
        _sync(device)
        t0 = time.perf_counter()
        batch = worker.generate(prompt_batch(shape, step), sampling)
        _sync(device)
        t1 = time.perf_counter()
        batch["advantages"] = with_advantages(len(batch), shape.n, g)[:, None] * batch["response_mask"]
        metrics = worker.update(batch)
        _sync(device)
        t2 = time.perf_counter()
        if step:  # the first step warms up
            records.append({"step_s": t2 - t0, "gen_s": t1 - t0, "update_s": t2 - t1,
                            "ref_s": metrics.get("timing_s/ref_in_update", 0.0),
                            "gen_tokens": int(batch["response_mask"].sum())})
    return _summary(records, device)


def run_plain(path: str, shape: Shape, steps: int, device: torch.device) -> dict:
    """transformers' generate + the plain update: the floor without any framework."""
    from rlhf.models.loading import load_causal_lm

    model = load_causal_lm(path, "float32").to(device)
    ref = load_causal_lm(path, "bfloat16").to(device).eval()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    records = []
    for step in range(steps + 1):
        prompts = prompt_batch(shape, step).to(device)
        _sync(device)
        t0 = time.perf_counter()
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
            out = model.generate(input_ids=prompts["input_ids"], attention_mask=prompts["attention_mask"],
                                 do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=shape.new_tokens, min_new_tokens=shape.new_tokens,
                                 num_return_sequences=shape.n, pad_token_id=0)
        _sync(device)
        t1 = time.perf_counter()
        batch = rollout_batch(shape, step)  # same layout; generated tokens differ, cost does not
        batch["responses"] = out[:, shape.prompt_len:].cpu()
        batch["input_ids"] = out.cpu()
        plain_update(model, ref, batch, shape.micro_batch, opt, device)
        _sync(device)
        t2 = time.perf_counter()
        if step:
            records.append({"step_s": t2 - t0, "gen_s": t1 - t0, "update_s": t2 - t1, "ref_s": None,
                            "gen_tokens": shape.prompts * shape.n * shape.new_tokens})
    return _summary(records, device)


def run_trl(path: str, shape: Shape, steps: int, device: torch.device, use_vllm: bool = False) -> dict:
    """TRL's GRPOTrainer on the same model and work (transformers generate, no vLLM)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlhf.models.loading import load_tokenizer

    tok = load_tokenizer(path)
    g = torch.Generator().manual_seed(0)
    rows = [{"prompt": tok.decode(torch.randint(3, 250, (shape.prompt_len,), generator=g))}
            for _ in range(shape.prompts * (steps + 2))]
    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            _sync(device)
            ends.append(time.perf_counter())

    out_dir = tempfile.mkdtemp(prefix="bench-trl-")
    config = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=shape.micro_batch, num_generations=shape.n,
        gradient_accumulation_steps=shape.prompts * shape.n // shape.micro_batch,
        max_completion_length=shape.new_tokens, generation_kwargs={"min_new_tokens": shape.new_tokens},
        temperature=1.0, top_p=1.0, top_k=0, learning_rate=LR, lr_scheduler_type="constant", beta=KL_COEF,
        epsilon=CLIP, loss_type="dapo", max_steps=steps + 1, logging_steps=1, save_strategy="no",
        report_to="none", bf16=device.type == "cuda", use_cpu=device.type != "cuda", gradient_checkpointing=False,
        disable_tqdm=True, seed=0,
        **({"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": VLLM_MEMORY} if use_vllm else {}),
    )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [float(len(c)) for c in completions],
                          args=config, train_dataset=Dataset.from_list(rows), processing_class=tok, callbacks=[Clock()])
    trainer.train()
    steps_s = [b - a for a, b in zip(ends, ends[1:])]
    records = [{"step_s": s, "gen_s": None, "update_s": None, "ref_s": None,
                "gen_tokens": shape.prompts * shape.n * shape.new_tokens} for s in steps_s]
    return _summary(records, device)


def _summary(records: list[dict], device: torch.device) -> dict:
    def median(key):
        values = [r[key] for r in records if r[key] is not None]
        return statistics.median(values) if values else None

    step = median("step_s")
    return {"step_s": step, "gen_s": median("gen_s"), "update_s": median("update_s"), "ref_s": median("ref_s"),
            "tokens_per_s": median("gen_tokens") / step, "peak_gib": _peak_gib(device), "steps": len(records)}


RUNNERS = {"rlhf": run_rlhf, "rlhf-shared": functools.partial(run_rlhf, shared_prefix=True), "plain": run_plain,
           "trl": run_trl, "rlhf-vllm": functools.partial(run_rlhf, vllm=True),
           "trl-vllm": functools.partial(run_trl, use_vllm=True)}


def run_child(framework: str, shape_name: str, steps: int, root: str, timeout_s: float | None = None) -> dict:
    """Run one framework in a fresh process; its JSON summary (or the error, also when it outlasts `timeout_s`)."""
    cmd = [sys.executable, __file__, "--child", framework, "--shape", shape_name, "--steps", str(steps), "--root", root]
    started = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as err:
        tail = (err.stderr or b"").decode(errors="replace") if isinstance(err.stderr, bytes) else (err.stderr or "")
        return {"error": [f"timed out after {timeout_s:.0f} s"] + tail.strip().splitlines()[-3:]}
    print(f"[gpu_step] {framework}: exit {done.returncode} in {time.perf_counter() - started:.0f} s", file=sys.stderr,
          flush=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]}
    return json.loads(lines[-1])


def write_result(out: str, name: str, info: dict, shape: str, result: dict) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, name).write_text(json.dumps({"machine": info, "shape": shape, "result": result}, indent=1, default=str))


def print_table(results: dict) -> None:
    base = (results.get("trl") or results.get("trl-vllm") or {}).get("step_s")
    print(f"{'framework':<11} {'step s':>7} {'gen s':>7} {'update s':>9} {'ref s':>6} {'tok/s':>8} {'peak GiB':>9} {'vs TRL':>7}")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<11} error: {r['error']}")
            continue
        fmt = lambda v, f: format(v, f) if v is not None else "-"  # noqa: E731
        ratio = f"{base / r['step_s']:.2f}x" if base else "-"
        print(f"{name:<11} {fmt(r['step_s'], '7.2f')} {fmt(r['gen_s'], '7.2f')} {fmt(r['update_s'], '9.2f')} "
              f"{fmt(r['ref_s'], '6.2f')} {r['tokens_per_s']:>8.0f} {fmt(r['peak_gib'], '9.1f')} {ratio:>7}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--proxy", action="store_true", help="CPU proxies (op counts, fp32 temporaries, master weights)")
    p.add_argument("--vocab-scale", type=int, default=16,
                   help="proxy: vocabulary and log-prob memory budget both divided by this (1: Qwen's 151,936). "
                        "Block rows = budget // vocab, so op counts and the temporary/logits ratio are the same; "
                        "bf16 matmuls are 7-40x slower than fp32 on a CPU without bf16 units; 1 took ~1 h here")
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen0.5b")
    p.add_argument("--steps", type=int, default=3, help="measured steps per framework (after one warm-up step)")
    p.add_argument("--frameworks", default="trl,rlhf,rlhf-shared,plain")
    p.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "rlhf-gpu-step-models"))
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--child-timeout", type=float, default=None, help="seconds one framework's process may take")
    p.add_argument("--child", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if a.child:
        if device.type == "cpu":
            torch.set_num_threads(1)
        path = build_model(SHAPES[a.shape], a.root)
        print(json.dumps(RUNNERS[a.child](path, SHAPES[a.shape], a.steps, device)))
        return 0
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    info = {"date": stamp, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__}
    if a.proxy:
        result = run_proxy(a.root, vocab_scale=a.vocab_scale)
        print_proxy(result)
        name = f"gpu_step-proxy-{stamp}.json"
    else:
        build_model(SHAPES[a.shape], a.root)
        name, result = f"gpu_step-{a.shape}-{stamp}.json", {}
        for fw in a.frameworks.split(","):  # written after each framework: a later hang keeps the earlier results
            result[fw] = run_child(fw, a.shape, a.steps, a.root, a.child_timeout)
            write_result(a.out, name, info, a.shape, result)
        print_table(result)
    write_result(a.out, name, info, a.shape, result)
    print(json.dumps(result, default=str))
    return 0 if not a.proxy or result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
