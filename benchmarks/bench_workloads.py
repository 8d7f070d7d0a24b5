"""The work both frameworks do in `grpo_vs_trl.py`: models, SFT warm start, our GRPO run, TRL's.

Every run happens in a fresh process (`grpo_vs_trl.py --child SPEC`), with one torch thread,
and returns per-step wall-clock times plus what each step generated. A step's time is the
wall-clock between the ends of consecutive steps, as each framework's own loop sees it
(our tracker's `track` call, TRL's `on_step_end` callback), so it includes logging and
everything else the loop does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

OUT_ROOT = Path("outputs/bench_grpo_vs_trl")  # gitignored; SFT checkpoints are cached here


@dataclasses.dataclass(frozen=True)
class ModelSize:
    """A tiny Qwen2 (byte-level tokenizer, float32) and the short SFT that warm-starts it."""

    name: str
    hidden_size: int
    num_layers: int
    sft_steps: int  # short: completions look like answers, accuracy well under 100%
    sft_lr: float


SIZES = {
    # experiments/arithmetic_tiny.py's model: 141k parameters
    "tiny": ModelSize("tiny", hidden_size=64, num_layers=2, sft_steps=300, sft_lr=2e-3),
    # 4.0M parameters (hidden 256, 4 layers, intermediate 1024)
    "5m": ModelSize("5m", hidden_size=256, num_layers=4, sft_steps=150, sft_lr=1e-3),
}


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark configuration: `prompts` x `samples` completions per step, one optimizer step."""

    size: str  # key of SIZES, or the name of a given model (`model`)
    max_new_tokens: int
    beta: float  # KL coefficient (k3 against the reference policy); 0: no reference model
    full_length: bool = False  # EOS masked until max_new_tokens (min_new_tokens): every completion is full length
    model: str | None = None  # a model folder used as it is (no SFT warm start); None: SIZES[size]'s SFT checkpoint
    prompts: int = 16  # prompts per step
    samples: int = 8  # completions per prompt
    micro_batch: int | None = None  # completions per forward/backward (gradient accumulation); None: all at once

    @property
    def name(self) -> str:
        name = f"{self.size}/{self.max_new_tokens}tok{'-full' if self.full_length else ''}/beta{self.beta:g}"
        if self.model is not None:
            name += f"/{self.prompts}x{self.samples}/mb{self.micro_batch or self.rows}"
        return name

    @property
    def rows(self) -> int:
        return self.prompts * self.samples

    @property
    def micro_rows(self) -> int:
        return self.micro_batch or self.rows

    @property
    def min_new_tokens(self) -> int:
        return self.max_new_tokens if self.full_length else 0


LR, GRAD_CLIP, TEMPERATURE, CLIP_EPS, SEED = 1e-4, 1.0, 1.0, 0.2, 0
ADAM_WEIGHT_DECAY = 0.01  # torch.optim.AdamW's default; TRL (TrainingArguments) defaults to 0
STD_EPS = 1e-4  # TRL adds 1e-4 to the group std; our GRPO's default is 1e-6


def last_number_score(solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 when the last number in the response equals the truth ("26 + 36 = 72." scores 1): a pretrained
    chat model explains before it answers, so exact match would score it 0 everywhere (no advantage)."""
    numbers = re.findall(r"-?\d+", solution_str)
    return 1.0 if numbers and numbers[-1] == str(ground_truth).strip() else 0.0


def scorer(w: Workload):
    """The reward both frameworks use: exact match for the SFT-warm-started tiny models, the last number otherwise."""
    from rlhf.rewards.arithmetic import exact_match_score

    return exact_match_score if w.model is None else last_number_score


def _threads() -> None:
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# ----------------------------------------------------------------------------- SFT
def sft_checkpoint(size: ModelSize) -> dict:
    """Our SFT stage, run once per model size and cached: {checkpoint, accuracy, params}."""
    _threads()
    import fiddle as fdl
    import torch
    from transformers import get_constant_schedule_with_warmup

    from rlhf.data.generators import arithmetic_rows
    from rlhf.data.prompts import PromptDataset
    from rlhf.data.sft import SFTDataset
    from rlhf.models.loading import load_tokenizer
    from rlhf.rewards.arithmetic import exact_match_score
    from rlhf.rewards.manager import RewardManager
    from rlhf.rollout.sampling import SamplingParams
    from rlhf.runtime.experiment import Experiment, run_experiment
    from rlhf.runtime.local import LocalRuntime
    from rlhf.trainers.evaluate import Evaluator
    from rlhf.trainers.sft import SFTTrainer
    from rlhf.workers.objectives import SFTObjective
    from rlhf.workers.training import TrainingSetup
    from rlhf_configs.pieces import policy_group, tiny_model

    model = tiny_model(str(OUT_ROOT / f"init-{size.name}"), hidden_size=size.hidden_size, num_layers=size.num_layers)
    tokenizer = fdl.Config(load_tokenizer, model)
    reward = fdl.Config(RewardManager, scorers={"arithmetic": exact_match_score})
    heldout = fdl.Config(
        Evaluator,
        dataset=fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=200, seed=0, split="test"),
                           tokenizer=tokenizer, name="heldout"),
        reward=reward,
        sampling=fdl.Config(SamplingParams, temperature=0.0, max_new_tokens=8),
    )
    sft = fdl.Config(
        SFTTrainer,
        policy=policy_group(
            model_path=model,
            objective=fdl.Config(SFTObjective),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=size.sft_lr),
            lr_scheduler=fdl.Partial(get_constant_schedule_with_warmup, num_warmup_steps=20),
            training=fdl.Config(TrainingSetup, micro_batch_size=128),
        ),
        data=fdl.Config(SFTDataset, rows=fdl.Config(arithmetic_rows, n=7000, seed=0, split="train"), tokenizer=tokenizer),
        batch_size=128,
        total_steps=size.sft_steps,
        evaluator=heldout,
    )
    graph = fdl.Config(
        Experiment, name=f"sft-{size.name}", stages={"sft": sft}, runtime=fdl.Config(LocalRuntime),
        output_dir=str(OUT_ROOT), run_name=f"cache-{size.sft_steps}steps", progress=False,
    )
    start = time.perf_counter()
    result = run_experiment(graph)["sft"]  # a finished stage is read back from its result.json
    checkpoint = str(result["checkpoint"])
    from transformers import AutoModelForCausalLM

    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(checkpoint).parameters())
    accuracy = {k: v for k, v in result["metrics"].items() if k.startswith("val")}
    return {"checkpoint": checkpoint, "params": params, "sft_metrics": accuracy,
            "seconds": round(time.perf_counter() - start, 1)}


# ---------------------------------------------------------------------- our framework
_STEPS: list[tuple[float, dict[str, float]]] = []


class StepRecorder:
    """A tracker for run_experiment that keeps every step's metrics and the wall-clock of its end."""

    def start_run(self, stage: str, *, name: str | None = None, params: dict | None = None, parent_run: str | None = None,
                  tags=()) -> StepRecorder:
        return self

    hash = None

    def track(self, metrics: dict[str, float], step: int) -> None:
        _STEPS.append((time.perf_counter(), dict(metrics)))

    def set_params(self, params: dict) -> None:
        pass

    def __enter__(self) -> StepRecorder:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


def our_graph(w: Workload, checkpoint: str, runtime: str, steps: int, out_dir: str, shared_prefix: bool = True,
              compile: bool = False):
    import fiddle as fdl
    import torch

    from rlhf.algos import GRPO, KLLoss, PPOClipLoss, kl_k3
    from rlhf.data.generators import arithmetic_rows
    from rlhf.data.prompts import PromptDataset
    from rlhf.models.loading import load_tokenizer
    from rlhf.rewards.manager import RewardManager
    from rlhf.rollout.sampling import SamplingParams
    from rlhf.runtime.experiment import Experiment
    from rlhf.runtime.local import LocalRuntime
    from rlhf.runtime.ray_runtime import RayRuntime
    from rlhf.runtime.remote import Remote
    from rlhf.trainers.rl import RLTrainer
    from rlhf.workers.objectives import PolicyObjective
    from rlhf.workers.training import TrainingSetup

    from bench_worker import TimedPolicyWorker

    tokenizer = fdl.Config(load_tokenizer, checkpoint)
    objective = fdl.Config(
        PolicyObjective,
        policy_loss=fdl.Config(PPOClipLoss, clip_low=CLIP_EPS, clip_high=CLIP_EPS),
        kl_loss=fdl.Config(KLLoss, estimator=kl_k3, coef=w.beta) if w.beta else None,
    )
    worker = fdl.Config(
        TimedPolicyWorker,
        model_path=checkpoint,
        shared_prefix=shared_prefix,
        ref_model_path=checkpoint if w.beta else None,
        objective=objective,
        optimizer=fdl.Partial(torch.optim.AdamW, lr=LR, weight_decay=ADAM_WEIGHT_DECAY),
        training=fdl.Config(TrainingSetup, micro_batch_size=w.micro_rows, grad_clip=GRAD_CLIP, seed=SEED,
                            compile=compile),
    )
    rl = fdl.Config(
        RLTrainer,
        policy=fdl.Config(Remote, name="policy", worker=worker, num_workers=1, cpus_per_worker=1),
        tokenizer=tokenizer,
        train_data=fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=7000, seed=0, split="train"),
                              tokenizer=tokenizer, name="train"),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": scorer(w)}),
        advantage=fdl.Config(GRPO, norm_by_std=True, eps=STD_EPS),
        sampling=fdl.Config(SamplingParams, n=w.samples, temperature=TEMPERATURE,
                            max_new_tokens=w.max_new_tokens, min_new_tokens=w.min_new_tokens),
        prompts_per_step=w.prompts,
        total_steps=steps,
        seed=SEED,
    )
    return fdl.Config(
        Experiment,
        name="grpo_vs_trl",
        stages={"grpo": rl},
        runtime=fdl.Config(RayRuntime if runtime == "ray" else LocalRuntime),
        tracker=fdl.Config(StepRecorder),
        output_dir=out_dir,
        progress=False,
    )


def run_ours(w: Workload, checkpoint: str, framework: str, steps: int, t0: float) -> dict:
    """framework: "ray" / "local" (as committed), "ray+full" / "local+full" (shared_prefix=False)."""
    _threads()
    from rlhf.runtime.experiment import run_experiment

    from rlhf.trainers.rl import RLTrainer

    cpu: list[float] = []  # process CPU seconds of each step: less sensitive to a contended machine than wall time
    inner_step = RLTrainer.step

    def step(self, *args, **kwargs):
        start = time.process_time()
        try:
            return inner_step(self, *args, **kwargs)
        finally:
            cpu.append(time.process_time() - start)

    RLTrainer.step = step
    out_dir = tempfile.mkdtemp(prefix="bench-ours-")
    try:
        runtime, _, variant = framework.partition("+")
        graph = our_graph(w, checkpoint, runtime, steps, out_dir, shared_prefix=variant != "full",
                          compile=variant == "compile")
        start = time.perf_counter()
        run_experiment(graph)
        end = time.perf_counter()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    ends = [t for t, _ in _STEPS]
    # the first step's start is not observable from the tracker: take the time of its own timer
    first = _STEPS[0][1]["timing_s/step"]
    step_s = [first] + [b - a for a, b in zip(ends, ends[1:])]
    per_step = []
    for s, (_, m), c in zip(step_s, _STEPS, cpu):
        tokens = m["response_length/mean"] * w.rows
        per_step.append({"step_s": s, "cpu_s": c, "gen_tokens": tokens, "reward": m["critic/score/mean"],
                         **{k: v for k, v in m.items() if k.startswith("timing_s/")},
                         "response_length_max": m["response_length/max"],
                         "prompt_length_mean": m.get("prompt_length/mean")})
    return {"per_step": per_step, "setup_s": ends[0] - first - t0, "run_s": end - start}


# ------------------------------------------------------------------------------- TRL
class PhaseClock:
    """Seconds spent in some of a TRL trainer's methods, per optimizer step (benchmark instrumentation)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def wrap(self, owner: Any, method: str, key: Callable[..., str] | str) -> None:
        inner = getattr(owner, method)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                name = key(*args, **kwargs) if callable(key) else key
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

        setattr(owner, method, timed)

    def take(self) -> dict[str, float]:
        out, self.seconds = self.seconds, {}
        return out


def run_trl(w: Workload, checkpoint: str, steps: int, t0: float) -> dict:
    _threads()
    from bench_peer import use_trl

    use_trl()  # an extracted wheel on $RLHF_TRL_PATH where TRL is not installed
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlhf.data.generators import arithmetic_rows
    from rlhf.models.loading import load_tokenizer

    rows = arithmetic_rows(7000, seed=0, split="train")
    dataset = Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]} for r in rows])
    score = scorer(w)

    def reward(completions, ground_truth, **_):
        return [score(c[0]["content"], gt) for c, gt in zip(completions, ground_truth)]

    ends: list[float] = []
    logs: list[dict] = []
    phases: list[dict[str, float]] = []
    clock = PhaseClock()

    cpu: list[float] = []  # process CPU seconds of each optimizer step (generation included)

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            cpu.append(-time.process_time())

        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())
            cpu[-1] += time.process_time()
            phases.append(clock.take())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                logs_copy = dict(logs)
                logs_copy["_t"] = time.perf_counter()
                captured.append(logs_copy)

    captured = logs
    out_dir = tempfile.mkdtemp(prefix="bench-trl-")
    try:
        config = GRPOConfig(
            output_dir=out_dir,
            per_device_train_batch_size=w.micro_rows,  # counts completions
            # one optimizer step per generation batch: steps_per_generation defaults to this, so TRL
            # generates all w.rows completions at once and trains on them in w.rows / w.micro_rows slices
            gradient_accumulation_steps=w.rows // w.micro_rows,
            num_generations=w.samples,
            max_completion_length=w.max_new_tokens,
            temperature=TEMPERATURE,
            top_p=1.0,
            top_k=0,
            generation_kwargs={"min_new_tokens": w.min_new_tokens} if w.min_new_tokens else None,
            learning_rate=LR,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=ADAM_WEIGHT_DECAY,
            max_grad_norm=GRAD_CLIP,
            beta=w.beta,
            epsilon=CLIP_EPS,
            loss_type="dapo",  # token mean over the whole batch = our token-mean aggregation
            scale_rewards="group",  # = our GRPO(norm_by_std=True)
            max_steps=steps,
            logging_steps=1,  # our trainer logs every step too
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=False,  # GRPOConfig defaults to bf16; we train in float32
            gradient_checkpointing=False,  # GRPOConfig defaults to True; we do not checkpoint
            seed=SEED,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=dataset,
            processing_class=load_tokenizer(checkpoint),
            callbacks=[Clock()],
        )
        clock.wrap(trainer, "_generate", "generate")
        clock.wrap(trainer, "_get_per_token_logps_and_entropies",
                   lambda model, *a, **k: "log_probs_ref" if model is trainer.ref_model else
                   ("forward" if torch.is_grad_enabled() else "log_probs_old"))
        clock.wrap(trainer.accelerator, "backward", "backward")
        clock.wrap(torch.optim.AdamW, "step", "optimizer")  # before train() builds the optimizer
        start = time.perf_counter()
        trainer.train()
        end = time.perf_counter()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    step_s = [ends[0] - start] + [b - a for a, b in zip(ends, ends[1:])]
    per_step = []
    for s, c, log, seconds in zip(step_s, cpu, logs, phases):
        per_step.append({"step_s": s, "cpu_s": c, "gen_tokens": log["completions/mean_length"] * w.rows,
                         "reward": log["reward"], "response_length_max": log.get("completions/max_length"),
                         **{f"trl_s/{k}": v for k, v in seconds.items()}})
    return {"per_step": per_step, "setup_s": start - t0, "run_s": end - start}


def child_main(spec: dict, t0: float) -> dict:
    w = Workload(**spec["workload"])
    if spec["framework"] == "trl":
        return run_trl(w, spec["checkpoint"], spec["steps"], t0)
    return run_ours(w, spec["checkpoint"], spec["framework"], spec["steps"], t0)


def write_json(path: str | Path, data: Any) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1, default=str))
