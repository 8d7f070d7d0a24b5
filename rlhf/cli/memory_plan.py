"""`rlhf plan --memory CONFIG`: what fits on N GPUs of a given size, for a model config file alone.

    rlhf plan --memory rlhf_configs/model_configs/qwen2.5-7b.json --gpus 8 --gpu-memory 80

One GRPO policy rank (actor, reference, rollout engine colocated, as the recipes place them) is
predicted by `PolicyWorker.predict_memory` for every combination of the knobs that matter (token
budget per micro-batch, gradient checkpointing, FSDP CPU offload, the engine and its share), with
the step's rows split over the GPUs; a critic (`--critic`) shares each GPU. Prints one row per
setting with its peak per GPU and whether it fits, cheapest knobs first. Nothing is loaded: the
config's numbers are all it needs (docs/memory.md reads the table).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table

from rlhf.argtypes import POSITIVE, OneLineParser, number
from rlhf.rollout.hf_engine import HFEngine
from rlhf.rollout.vllm_engine import VLLMEngine
from rlhf.runtime.preflight.memory import device_peak
from rlhf.workers.critic import CriticWorker
from rlhf.workers.fsdp import FSDP
from rlhf.workers.memory import GiB, ModelShape, Placement, Workload
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.training import TrainingSetup


def _arguments(argv: Sequence[str]) -> tuple[argparse.Namespace, ModelShape]:
    """The flags, each checked where it is parsed, and the model's shape; a bad one exits 2 in one line."""
    p = OneLineParser(prog="rlhf plan --memory", description=__doc__.splitlines()[0])
    p.add_argument("config", help="a model's config.json (or its folder); no weights are read")
    p.add_argument("--gpus", type=POSITIVE, default=8, help="GPUs, one FSDP rank each (default 8)")
    p.add_argument("--gpu-memory", type=number(float, 0, low_open=True), default=80.0, help="GB per GPU (default 80)")
    p.add_argument("--prompts", type=POSITIVE, default=64, help="prompts per step (default 64)")
    p.add_argument("--n", type=POSITIVE, default=8, help="samples per prompt (default 8)")
    p.add_argument("--prompt-tokens", type=POSITIVE, default=1024, help="longest prompt (default 1024)")
    p.add_argument("--response-tokens", type=POSITIVE, default=1024, help="max new tokens (default 1024)")
    p.add_argument("--critic", action="store_true", help="PPO: a critic of the same shape on every GPU too")
    p.add_argument("--all", action="store_true", help="list settings that do not fit too")
    a = p.parse_args(argv)
    try:
        return a, ModelShape.from_config(a.config)
    except FileNotFoundError as err:
        p.error(f"{a.config}: no such file ({err.filename or a.config}); give a model's config.json or its folder")
    except (OSError, ValueError, TypeError, AttributeError) as err:  # unreadable, not JSON, not a model's config
        p.error(f"{a.config} is not a model config the planner can read ({' '.join(str(err).split())}); give "
                "a Hugging Face config.json of a decoder-only transformer (Llama, Qwen2, Mistral and alike)")


def memory_plan_main(argv: Sequence[str]) -> int:
    a, shape = _arguments(argv)
    capacity = a.gpu_memory * 1e9
    rows = max(1, -(-a.prompts * a.n // a.gpus))
    workload = Workload(a.prompt_tokens, a.response_tokens, n=a.n, rows=rows)
    tokens = workload.tokens
    budgets = sorted({tokens * k for k in (2, 4, 8, 16)})
    engines = [("vLLM 0.3", functools.partial(VLLMEngine, gpu_memory_utilization=0.3)),
               ("vLLM 0.5", functools.partial(VLLMEngine, gpu_memory_utilization=0.5)),
               (f"transformers, {a.n * 8} rows/call", functools.partial(HFEngine, max_rows_per_call=a.n * 8))]
    results = []
    for offload, checkpointing, budget, (engine_name, engine) in itertools.product(
        (False, True), (False, True), budgets, engines
    ):
        training = TrainingSetup(strategy=FSDP(cpu_offload=offload), compute_dtype="bfloat16",
                                 gradient_checkpointing=checkpointing, max_tokens_per_micro_batch=budget)
        placement = Placement("cuda", a.gpus, fsdp=True, cpu_offload=offload, device_bytes=capacity,
                              process_group=True)
        policy = PolicyWorker.predict_memory(  # the worker's signature fills in the rest
            dict(model_path=shape, ref_model_path=shape, objective=True, training=training, engine=engine),
            workload, placement)
        estimates = [policy]
        if a.critic:
            estimates.append(CriticWorker.predict_memory(dict(model_path=shape, training=training), workload,
                                                         placement))
        peak, where = device_peak(estimates)
        cost = (offload, checkpointing, -budget, engine_name.startswith("transformers"))
        results.append((cost, offload, checkpointing, budget, engine_name, peak, where, policy.host))
    results.sort(key=lambda r: r[0])
    table = Table(title=f"{os.path.basename(a.config)} ({shape.parameters() / 1e9:.2f}B parameters), GRPO: "
                  f"{a.prompts} prompts x {a.n}, {a.prompt_tokens}+{a.response_tokens} tokens, on {a.gpus} x "
                  f"{a.gpu_memory:g} GB" + (", with a critic" if a.critic else ""),
                  title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("FSDP offload", "grad. ckpt", "tokens/micro-batch", "engine", "peak memory per GPU", "at",
                   "host RAM per rank", "fits"):
        table.add_column(column, justify="right" if column in ("tokens/micro-batch", "peak memory per GPU",
                                                               "host RAM per rank") else "left")
    shown = 0
    for _, offload, ckpt, budget, engine_name, peak, where, host in results:
        fits = peak <= capacity
        if not fits and not a.all:
            continue
        shown += 1
        table.add_row("on" if offload else "off", "on" if ckpt else "off", f"{budget:,}", engine_name,
                      f"{peak / GiB:.1f} GB", where, f"{sum(t.bytes for t in host) / GiB:.1f} GB" if host else "-",
                      "yes" if fits else "no")
    console = Console(width=180, record=True, file=open(os.devnull, "w"))
    console.print(table)
    print("\n".join(line.rstrip() for line in console.export_text().rstrip().splitlines()))
    if not shown:
        print(f"nothing fits on {a.gpus} x {a.gpu_memory:g} GB: use more GPUs (--gpus), shorter sequences, or fewer "
              "prompts per step (rerun with --all to see each setting's peak)")
        return 1
    print(f"{shown} of {len(results)} settings fit, cheapest first (--all lists the rest). GB = 2^30 bytes; "
          "the GPU's size is --gpu-memory x 10^9. Predicted per rank, from the config alone: docs/memory.md.")
    return 0
