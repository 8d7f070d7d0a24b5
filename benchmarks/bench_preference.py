"""The work both frameworks do in `preference_vs_trl.py`: the pairs, our reward-model and DPO stages, TRL's.

Every run happens in a fresh process (`preference_vs_trl.py --child SPEC`) with one torch thread and
returns, per optimizer step, the wall-clock and CPU seconds and the seconds of each phase. The phases are
timed by the same class-level wrappers on both sides, so they mean the same thing:

- `forward`: the model's backbone (`LlamaModel.forward`, `Qwen2Model.forward`) with gradients on;
- `forward_no_grad`: the same without gradients (TRL's per-step reference forward, when it runs one);
- `backward`: `Accelerator.backward` (both sides call it; with gradient checkpointing the recomputed
  forward is in here);
- `clip`: `torch.nn.utils.clip_grad_norm_`; `optimizer`: `torch.optim.AdamW.step`;
- `other`: the rest of the step (the LM head and log-softmax or the score head, the loss, batching,
  logging).

A step's time is the wall-clock between the ends of consecutive optimizer steps as each loop sees them
(our tracker's `track`, TRL's `on_step_end`), so it includes data loading and logging on both sides; the
first step's is from its own start. Peak memory is the kernel's high-water mark of resident memory
(VmHWM, `bench_peer.PeakRSS`) in three phases: set-up (imports, model loads, tokenisation, the reference
pass), the steps, and after them (our stage writes its `final/` folder; TRL's run saves nothing).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_peer import PeakRSS, use_trl
from bench_workloads import PhaseClock, write_json

OUT_ROOT = Path("outputs/bench_preference_vs_trl")  # gitignored: the pairs files
LR = {"rm": 1e-5, "dpo": 1e-6}  # our stages' defaults (TRL's DPO default too); set on both sides
WEIGHT_DECAY = {"rm": 0.01, "dpo": 0.0}  # our stages' AdamW weight decay; set on both sides
BETA = 0.1  # DPO's beta, both sides' default
GRAD_CLIP, SEED = 1.0, 0

# ------------------------------------------------------------------------ the pairs
_GOOD = [
    "{T} is a common thing that many people meet in daily life.",
    "In short, {t} is best understood by looking at what it is used for.",
    "People often describe {t} by its shape, its size and the way it works.",
    "A simple example helps: think of the last time you saw {a} {t} up close.",
    "Most guides agree that {t} is easy to learn about with a little care.",
    "If you want to know more, a library book about {t} is a good next step.",
    "Safety matters too, so handle {a} {t} with the usual common sense.",
    "That is the core idea, and the details follow from it naturally.",
]
_BAD = [
    "I am not sure what you mean, but here is something unrelated.",
    "Many things exist in the world and some of them are interesting.",
    "The weather was nice yesterday and the shops were quite busy.",
    "It depends on a lot of factors that are hard to explain here.",
    "Some people say one thing and other people say something else.",
    "You could look it up somewhere, maybe in a book or online.",
    "There is no single answer, so any answer is as good as another.",
    "Anyway, that is more or less all there is to say about it.",
]


def _answer(pool: list[str], words: int, rng: random.Random, topic: str) -> str:
    article = "an" if topic[0] in "aeiou" else "a"
    order = rng.sample(pool, len(pool))  # each sentence once before any repeats
    out: list[str] = []
    while sum(len(s.split()) for s in out) < words:
        out.append(order[len(out) % len(order)].format(T=topic.capitalize(), t=topic, a=article))
    return " ".join(out)


def pair_rows(n: int, answer_words: int, seed: int = 0) -> list[dict]:
    """`n` preference pairs in the conversational layout both frameworks read (prompt, chosen, rejected as
    messages): everyday questions (`rlhf.data.generators.topic_prompt_rows`), a chosen answer on the topic and
    a rejected one off it, each about `answer_words` words (+-25%, so lengths vary as in real data).
    Deterministic in (n, answer_words, seed)."""
    from rlhf.data.generators import topic_prompt_rows

    rows = []
    for i, prompt in enumerate(topic_prompt_rows(n, seed=seed)):
        rng = random.Random(f"{seed}/{i}")
        topic = prompt["extra_info"]["topic"]
        words = max(1, round(answer_words * rng.uniform(0.75, 1.25)))
        rows.append({"prompt": prompt["prompt"],
                     "chosen": [{"role": "assistant", "content": _answer(_GOOD, words, rng, topic)}],
                     "rejected": [{"role": "assistant", "content": _answer(_BAD, words, rng, topic)}]})
    return rows


def write_pairs(n: int, answer_words: int, seed: int = 0) -> Path:
    """The pairs file (jsonl, written once per (n, answer_words, seed) under OUT_ROOT)."""
    path = OUT_ROOT / f"pairs-{n}x{answer_words}w-s{seed}.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in pair_rows(n, answer_words, seed)))
        tmp.replace(path)
    return path


# ----------------------------------------------------------------- instrumentation
class StepClock:
    """Per optimizer step: wall-clock at its end, CPU seconds, the phases' seconds; peak RSS by phase."""

    def __init__(self, total_steps: int):
        self.total_steps = total_steps
        self.phases = PhaseClock()
        self.memory = PeakRSS()
        self.ends: list[float] = []
        self.begins: list[float] = []
        self.cpu: list[float] = []
        self.per_step: list[dict[str, float]] = []
        self.setup: dict[str, float] = {}
        self._cpu_start = 0.0

    def begin(self) -> None:
        if not self.begins:  # what ran before the first step: set-up (the reference pass among it)
            self.setup = self.phases.take()
            self.memory.mark("setup")
        self.phases.take()  # data loading between steps belongs to no phase
        self.begins.append(time.perf_counter())
        self._cpu_start = time.process_time()

    def end(self, metrics: dict[str, float] | None = None) -> None:
        if len(self.ends) == len(self.begins):  # no step open (a log call outside the loop)
            return
        self.ends.append(time.perf_counter())
        self.cpu.append(time.process_time() - self._cpu_start)
        self.per_step.append({**self.phases.take(), **(metrics or {})})
        if len(self.ends) == self.total_steps:
            self.memory.mark("steps")

    def instrument(self, model_path: str) -> None:
        """The class-level wrappers (module docstring), installed before either framework builds anything."""
        import accelerate
        import torch
        import transformers

        arch = json.loads((Path(model_path) / "config.json").read_text())["architectures"][0]
        backbone = getattr(transformers, arch.replace("ForCausalLM", "Model"))
        self.phases.wrap(backbone, "forward", lambda *a, **k: "forward" if torch.is_grad_enabled() else "forward_no_grad")
        self.phases.wrap(accelerate.Accelerator, "backward", "backward")
        self.phases.wrap(torch.nn.utils, "clip_grad_norm_", "clip")
        self.phases.wrap(torch.optim.AdamW, "step", "optimizer")

    def result(self, t0: float, extra: dict[str, Any]) -> dict:
        self.memory.mark("after")
        step_s = [self.ends[0] - self.begins[0]] + [b - a for a, b in zip(self.ends, self.ends[1:])]
        per_step = [{"step_s": s, "cpu_s": c, **{f"phase_s/{k}" if not k.startswith("tokens") else k: v
                                                  for k, v in p.items()}}
                    for s, c, p in zip(step_s, self.cpu, self.per_step)]
        return {"per_step": per_step, "setup_s": self.begins[0] - t0, "setup_phases_s": self.setup,
                "peak_rss_by_phase_mib": self.memory.peaks_mib, "hwm_resettable": self.memory.resettable, **extra}


CLOCK: StepClock | None = None  # the child's clock, read by OurTracker (built by the experiment runner)


class OurTracker:
    """A tracker for run_experiment that ends the clock's step at each `track` (our loop's end of a step)."""

    hash = None

    def start_run(self, stage: str, **_: Any) -> OurTracker:
        return self

    def track(self, metrics: dict[str, float], step: int) -> None:
        CLOCK.end({"tokens": metrics.get("perf/total_num_tokens", float("nan"))})

    def set_params(self, params: dict) -> None:
        pass

    def __enter__(self) -> OurTracker:
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


def _threads() -> None:
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")


# -------------------------------------------------------------------- our stages
def run_ours(spec: dict, t0: float) -> dict:
    """Our `rm_stage` / `dpo_stage` (the graphs `rlhf rm` and `rlhf dpo` build), LocalRuntime, one micro-batch
    per step, the stage's defaults otherwise (DPO: reference log-probs computed once before the first step and
    read from the cache; its reference model is then let go)."""
    global CLOCK
    _threads()
    import fiddle as fdl

    from rlhf.runtime.experiment import Experiment, run_experiment
    from rlhf.runtime.local import LocalRuntime

    CLOCK = clock = StepClock(spec["steps"])
    clock.instrument(spec["model"])
    task, pairs = spec["task"], spec["pairs_per_step"]
    common = dict(steps=spec["steps"], batch_size=pairs, lr=LR[task], warmup_steps=0, max_length=spec["max_length"],
                  test_freq=0)
    if task == "dpo":
        from rlhf.trainers.dpo import DPOTrainer as Trainer
        from rlhf_configs.dpo import dpo_stage

        stage = dpo_stage(spec["model"], spec["data"], micro_batch_size=pairs, **common)
        stage.policy.worker.training.gradient_checkpointing = spec["gradient_checkpointing"]
        stage.val_batch_size = pairs  # the reference pass's batch: TRL's precompute_ref_batch_size default
        clock.phases.wrap(Trainer, "reference_log_probs", "reference_pass")
    else:
        from rlhf.trainers.reward_model import RewardModelTrainer as Trainer
        from rlhf_configs.reward_model import rm_stage

        stage = rm_stage(spec["model"], spec["data"], micro_batch_size=2 * pairs, **common)  # rows: 2 per pair
        stage.rm.worker.training.gradient_checkpointing = spec["gradient_checkpointing"]
    inner_step = Trainer.step

    def step(self, batch):
        clock.begin()
        return inner_step(self, batch)

    Trainer.step = step
    out_dir = tempfile.mkdtemp(prefix="bench-pref-ours-")
    try:
        graph = fdl.Config(Experiment, name=f"{task}_vs_trl", stages={task: stage},
                           runtime=fdl.Config(LocalRuntime), tracker=fdl.Config(OurTracker), output_dir=out_dir,
                           progress=False)
        run_experiment(graph)
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return clock.result(t0, {})


# ------------------------------------------------------------------------- TRL
def run_trl(spec: dict, t0: float) -> dict:
    """TRL's `RewardTrainer` / `DPOTrainer` on the same pairs file, batch, lengths, precision, learning rate,
    weight decay, clipping and checkpointing. framework "trl": DPO with `precompute_ref_log_probs=True` (the
    reference log-probs computed once before training, as ours; TRL then holds no reference model);
    "trl-per-step": TRL's default, a frozen reference model and its forward in every step."""
    _threads()
    version = use_trl()
    if version is None:
        raise SystemExit("TRL is not importable (set RLHF_TRL_PATH; benchmarks/bench_peer.py)")
    import datasets
    import torch
    from transformers import TrainerCallback

    clock = StepClock(spec["steps"])
    clock.instrument(spec["model"])
    task, pairs = spec["task"], spec["pairs_per_step"]
    tokens: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock.begin()

        def on_step_end(self, args, state, control, **kwargs):
            clock.end()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "num_tokens" in logs:
                tokens.append(logs["num_tokens"])

    out_dir = tempfile.mkdtemp(prefix="bench-pref-trl-")
    try:
        # a datasets cache of this run's own, so no run reads another's (the set-up time is reported, not ratioed)
        dataset = datasets.load_dataset("json", data_files=spec["data"], split="train",
                                        cache_dir=str(Path(out_dir) / "datasets"))
        common = dict(
            output_dir=out_dir, per_device_train_batch_size=pairs, gradient_accumulation_steps=1,
            max_length=spec["max_length"], learning_rate=LR[task], lr_scheduler_type="constant", warmup_steps=0,
            weight_decay=WEIGHT_DECAY[task], max_grad_norm=GRAD_CLIP, max_steps=spec["steps"], logging_steps=1,
            save_strategy="no", report_to="none", use_cpu=True, bf16=False,  # TRL defaults to bf16; both fp32
            gradient_checkpointing=spec["gradient_checkpointing"],  # TRL defaults to True; set equal on both
            seed=SEED, dataloader_num_workers=0, disable_tqdm=True, model_init_kwargs={"dtype": torch.float32},
        )
        if task == "dpo":
            from trl import DPOConfig, DPOTrainer

            config = DPOConfig(beta=BETA, loss_type=["sigmoid"], precompute_ref_log_probs=spec["framework"] == "trl",
                               **common)
            clock.phases.wrap(DPOTrainer, "_precompute_ref_logps", "reference_pass")
            trainer = DPOTrainer(model=spec["model"], args=config, train_dataset=dataset, callbacks=[Clock()])
        else:
            from trl import RewardConfig, RewardTrainer

            trainer = RewardTrainer(model=spec["model"], args=RewardConfig(**common), train_dataset=dataset,
                                    callbacks=[Clock()])
        trainer.train()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    # TRL logs the running total of tokens; each step's own is the difference
    for step, (before, after) in enumerate(zip([0.0, *tokens], tokens)):
        if step < len(clock.per_step):
            clock.per_step[step]["tokens"] = after - before
    return clock.result(t0, {"trl_version": version})


def child_main(spec: dict, t0: float) -> dict:
    if spec["framework"] == "ours":
        return run_ours(spec, t0)
    return run_trl(spec, t0)


__all__ = ["child_main", "write_json", "write_pairs", "pair_rows", "OUT_ROOT"]
