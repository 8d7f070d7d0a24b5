"""On-policy distillation on a real model: SmolLM2-135M-Instruct learns the task from a teacher that scores every
token it samples, instead of from one reward per answer (docs/distillation.md).

    python experiments/smollm2_distill.py --config 'config:base(teacher="path/to/teacher")'   # distil a teacher
    python experiments/smollm2_distill.py                          # stage "teacher" makes one (GRPO), then distils
    python experiments/smollm2_distill.py --config 'config:base(teacher="...")' --config fiddler:with_task_reward
    python experiments/smollm2_distill.py --config 'config:base(teacher="...")' --config 'fiddler:top_k(k=16)'
    python experiments/smollm2_distill.py --config fiddler:smoke    # a few tiny steps on the real model (tests)

The task, its held-out evaluator and every setting of the student's stage are `experiments/smollm2_tasks.py`'s
(arithmetic by our generator, "The answer is N." asked for; 8 prompts at temperature 0.7, 64 new tokens; PPO clip
0.2/0.28, no KL, AdamW 2e-5 decaying to 0, two optimizer steps per batch; 100 validation rows, greedy, keep
`best/`, and its `base` and `test` stages measure the instruct model and the last weights on 200 test rows): this file
changes the advantage, adds the forward KL over the teacher's top-16 tokens to the loss, and samples 4 answers
per prompt where GRPO samples 8 (no group baseline is needed). `rlhf_configs.algorithms.use_distillation` gives the policy worker
the frozen teacher (stored in the compute dtype, sharded like the reference) and makes the advantage the per-token
reverse KL to it, log mu(y_t) - log pi(y_t), both at the sampling temperature (`OnPolicyDistillation`); the task
reward is still scored and logged (`critic/score/mean`), and `with_task_reward` adds the GRPO advantage to the
distillation term. The teacher must have the student's tokenizer: another one is refused before any model loads.

Without `teacher`, a first stage makes one with the task recipe (`teacher_steps` GRPO steps from the same
instruct model) and the second distils it into a fresh copy of the instruct model, as `benchmarks/distillation.py`
does to compare OPD with GRPO and with SFT on teacher samples.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import fiddle as fdl

from rlhf.algos import GRPO, TopKForwardKL
from rlhf.runtime.experiment import Experiment
from rlhf.runtime.remote import StageOutput
from rlhf.trainers.evaluate import EvalStage
from rlhf_configs.algorithms import use_distillation
from rlhf_configs.rows import limit_rows

sys.path.insert(0, str(Path(__file__).resolve().parent))
import smollm2_tasks  # noqa: E402  the task, its rows, scorers and GRPO settings: this recipe derives from it

NAME = "smollm2_distill"


def base(teacher: Any = None, student: str = "smollm2-135m-instruct", task: str = "arithmetic",
         settings: dict[str, Any] | None = None, steps: int = 10, lr: float = 2e-5, distill_coef: float = 1.0,
         teacher_steps: int = 10, samples_per_prompt: int = 4, top_k: int = 16) -> fdl.Config[Experiment]:
    """OPD of `teacher` (a model folder) into `student` on `task` for `steps` steps of smollm2_tasks' stage;
    teacher None: a stage "teacher" first trains one with that recipe for `teacher_steps` GRPO steps.

    `samples_per_prompt` (4, where GRPO takes 8): the teacher grades every token, so no group of answers to one
    prompt is needed for a baseline, and each step costs half of GRPO's in sampling, teacher scoring and update;
    4 rather than 1 keeps groups for `with_task_reward`'s GRPO term.

    `top_k` (16; 0: off): the loss also takes the forward KL to the teacher over its top-k tokens at every sampled
    position (GKD-style, `TopKForwardKL`): k teacher probabilities per token instead of the sampled one's, so the
    student needs fewer steps. Measured over 3 seeds on SmolLM2 (docs/distillation.md): 90% of the teacher in
    2-3 steps (1.6-2.9 min) with it, 3-5 steps (2.9-4.9 min) without, at about the same cost per step."""
    stages = {}
    if teacher is None:
        stages["teacher"] = smollm2_tasks.base(task=task, settings=settings, model=student,
                                               steps=teacher_steps).stages["grpo"]
        teacher = fdl.Config(StageOutput, stage="teacher")
    cfg = smollm2_tasks.base(task=task, settings=settings, model=student, steps=steps, lr=lr)
    distill = cfg.stages["grpo"]
    use_distillation(distill, teacher, distill_coef=distill_coef)
    distill.sampling.n = samples_per_prompt
    if top_k:
        distill.policy.worker.objective.distill_loss = fdl.Config(TopKForwardKL, k=top_k)
    test = cfg.stages["test"]  # the test rows on the distilled weights (final/)
    test.policy.worker.model_path = fdl.Config(StageOutput, "distill", "checkpoint")
    cfg.stages = {**stages, "base": cfg.stages["base"], "distill": distill, "test": test}
    cfg.name = NAME
    cfg.tracker.experiment = NAME
    return cfg


def with_task_reward(cfg: fdl.Config[Experiment]) -> None:
    """OPD + GRPO: the distillation term plus the task's GRPO advantage (`OnPolicyDistillation(task=GRPO())`)."""
    cfg.stages["distill"].advantage.task = fdl.Config(GRPO, norm_by_std=True)


def top_k(cfg: fdl.Config[Experiment], k: int = 16) -> None:
    """The forward KL over the teacher's top-`k` tokens at each sampled position in the loss (GKD-style; the
    default adds it with k=16: this sets another k)."""
    cfg.stages["distill"].policy.worker.objective.distill_loss = fdl.Config(TopKForwardKL, k=k)


def smoke(cfg: fdl.Config[Experiment]) -> None:
    """A few tiny steps on the real model (tests): 2 prompts x 2 samples of 8 tokens per step, 1 teacher step and
    2 distillation steps, validation on 4 rows."""
    for name, stage in cfg.stages.items():
        if fdl.get_callable(stage) is EvalStage:  # the test rows before and after: 4 of them, 8 tokens
            stage.evaluator.sampling.max_new_tokens = 8
            limit_rows(stage.evaluator.dataset, 4)
            continue
        stage.total_steps = 1 if name == "teacher" else 2
        stage.prompts_per_step = 2
        stage.sampling.n = 2
        stage.sampling.max_new_tokens = stage.evaluator.sampling.max_new_tokens = 8
        stage.val_before_train = False
        stage.test_freq = 0
        limit_rows(stage.train_data, 16)
        limit_rows(stage.evaluator.dataset, 4)
        if isinstance(stage.policy.worker.lr_scheduler, fdl.Partial):
            stage.policy.worker.lr_scheduler.num_training_steps = stage.total_steps * 2


if __name__ == "__main__":
    from rlhf.cli.experiment import run_cli

    run_cli(sys.modules[__name__])
