"""GRPO on SmolLM2-135M-Instruct for any task with a checkable answer: one default recipe, not tuned per task.

    python experiments/smollm2_tasks.py --config 'config:base(task="reasoning_gym/gcd", settings={"max_value": 20})'
    python experiments/smollm2_tasks.py --config 'config:base(task="reasoning_gym/chain_sum", settings={"max_terms": 2})'
    python experiments/smollm2_tasks.py --config 'config:base(task="arithmetic")'           # our own generator
    python experiments/smollm2_tasks.py --config 'config:base(task="data/mytask")'  # DIR/{train,test}.parquet, verl schema
    python experiments/smollm2_tasks.py --config fiddler:smoke                     # 2 tiny steps (tests)

Its parts, each chosen for a mechanism rather than a task (docs/bring_your_own_model.md has the measured panel:
held-out accuracy +20.5 points on average over eight tasks in six seeds (+17.9 to +24.5), 4-5 of eight +10 or more in
each; basic_arithmetic gains 10 in one seed of six, lcm in none, and letter_counting collapses onto its most common
answer, so watch the held-out curve):
- **The answer is asked for in a form the model follows and a scorer reads without guessing**: "The answer is
  <answer>." (`rlhf.data.reasoning_gym.ANSWER_INSTRUCTION`; SmolLM2 follows it in 23 of 24 greedy replies, a last
  line "Answer: ..." in 1 of 24), read by `rlhf.rewards.final_answer.final_answer`.
- **The reward pays only for right answers** (`RightAnswerReward`): 1 for a right answer in that form,
  `unformatted_credit` (0.1) for a right answer without it (read leniently: the last line or last number), 0 for any
  wrong answer, whatever partial credit the task's own scorer would give it (reasoning-gym's letter_counting gives
  0.5 for "18" where the truth is 1: paid, it took SmolLM2 from 54% to 18% held-out). Held-out accuracy counts full
  credit only (`Correct`). The unformatted credit gives a first signal where the base model never writes the form
  (arithmetic), and keeps its size because advantages are not divided by the group's std (below).
- **Samples close to the policy that is evaluated**: temperature 0.7. At 1.0, 4-5% of SmolLM2's samples on
  letter_counting were right where its greedy answers are right 50% of the time; the groups then said little about
  the greedy policy.
- **Advantages without the group's std** (`GRPO(norm_by_std=False)`, as Dr. GRPO): divided by it, a group whose
  best answer earned only the 0.1 credit pushed as hard as one with a fully right answer, and SmolLM2 learnt to
  drop the form (letter_counting 50% -> 0% strict at temperature 1.0 with the std; 50% -> 60% without).
- **The response budget leaves room for the model's own way of answering**: 64 new tokens, where SmolLM2's
  greedy answers on the panel's tasks have a p90 of about 10-20 (`rlhf probe`, docs/generate_and_eval.md); a task
  whose answers are longer needs `config:base(max_new_tokens=...)` from its probe. Sampled answers ramble longer,
  and every token costs: at 192 tokens one step took 6.5 minutes on this 2-core machine.
- **Held-out rows are what to watch, and the test rows are looked at twice**: 100 validation rows, greedy, strict
  (the form) and lenient (format aside), before training and every 4 steps, drive the alarms and keep `best/`
  (never a validation whose answers collapsed onto one); the `base` and `test` stages measure the instruct model
  and the last weights (`final/`) on 200 test rows the validations never saw. `best/` is not what the test stage
  measures: over two seeds of the panel it scored 1.7 points below `final/` on the test rows (picking among close
  validations on 100 rows is noisy), though it kept letter_counting from its collapse (docs/transfer_panel.md).
  The training score says little by itself.

The other settings follow `experiments/smollm2_arithmetic.py`, our one earlier real-model result: fp32 on CPU,
PPO clip 0.2/0.28, no KL, AdamW 2e-5 decaying linearly to 0, two optimizer steps per batch; 8 prompts x 8
samples per step, 16 steps (10 until 2026-11-29: a mean gain of +14.9 over four seeds, +10.7 to +19.7; 16 steps
see 128 questions instead of 80, and the seeds' means moved closer together; 32 steps in the same time budget
gained more on some tasks and fell below the base on others, docs/transfer_panel.md). Rows of groups whose samples scored alike cost nothing in the update (it leaves them
out: docs/training_step.md).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import fiddle as fdl
import torch
from transformers import get_linear_schedule_with_warmup

from rlhf.algos import GRPO, DynamicSamplingAccumulator, KLLoss, PPOClipLoss, kl_k3
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.reasoning_gym import ANSWER_INSTRUCTION, reasoning_gym_rows
from rlhf.data.sources import load_rows
from rlhf.models.importing import model_folder
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.arithmetic import exact_match_score
from rlhf.rewards.final_answer import Correct, FinalAnswerScorer, LenientScorer, RightAnswerReward
from rlhf.rewards.manager import RewardManager
from rlhf.rewards.reasoning_gym import reasoning_gym_score, task_answer_score
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.tracking.aim_tracker import AimTracker
from rlhf.runtime.remote import StageOutput
from rlhf.trainers.evaluate import EvalStage, Evaluator
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.training import TrainingSetup
from rlhf_configs.pieces import policy_group
from rlhf_configs.rows import limit_rows

NAME = "smollm2_tasks"
MAX_PROMPT_LENGTH = 256
"""Tokens; longer prompts are dropped (and counted). reasoning-gym questions at default settings fit."""
HELDOUT = 200
"""Test rows, greedy: a 95% interval of about +-7 points at 50%."""
VALIDATION = 100
"""Validation rows, greedy, before training and every quarter of the steps: the alarms watch them, and `best/` is
the best of them (the test stage measures the last weights)."""


def with_instruction(rows: list[dict], instruction: str = ANSWER_INSTRUCTION) -> list[dict]:
    """The rows with `instruction` after each user message, as reasoning-gym rows have it."""
    return [{**row, "prompt": [{**m, "content": f"{m['content']}\n\n{instruction}"} if m["role"] == "user" else m
                               for m in row["prompt"]]} for row in rows]


def task_rows(task: str, split: str, n: int, settings: dict[str, Any] | None = None) -> fdl.Config:
    """The rows of `task` for `split` ("train", "val" or "test"): "reasoning_gym/<name>" (generated, with
    `settings`), "arithmetic" (our generator), or a folder holding `train.parquet` and `test.parquet` in verl's
    schema (asking for the form), and `val.parquet` if it has one.

    "val" picks `best/`: questions of the training split drawn with a seed of their own (the test rows are never
    looked at before the end; where a task has few questions some were also trained on). A folder without
    `val.parquet` validates on its test rows, and its test figure then includes that choice."""
    seed = 1 if split == "val" else 0
    drawn_from = "train" if split == "val" else split
    if task.startswith("reasoning_gym/"):
        return fdl.Config(reasoning_gym_rows, task.removeprefix("reasoning_gym/"), n=n, seed=seed, split=drawn_from,
                          **(settings or {}))
    if task == "arithmetic":
        return fdl.Config(with_instruction, fdl.Config(arithmetic_rows, n=n, seed=seed, split=drawn_from))
    folder = Path(task).expanduser()
    if split == "val" and not (folder / "val.parquet").exists():
        split = "test"
    return fdl.Config(load_rows, path=str(folder / f"{split}.parquet"), limit=n if split != "train" else None)


def task_scorers(task: str, scorer: Any = None) -> tuple[dict, dict]:
    """(strict, lenient) scorer tables by data_source: the task's own judgement of the final answer, and the same
    judgement format aside. A folder's rows need `scorer` (a scorer of bare answers, e.g. `exact_match_score`)."""
    if task.startswith("reasoning_gym/"):
        return {"reasoning_gym/*": reasoning_gym_score}, {"reasoning_gym/*": fdl.Config(LenientScorer, task_answer_score)}
    inner = exact_match_score if task == "arithmetic" and scorer is None else scorer
    if inner is None:
        raise ValueError(f"smollm2_tasks: the rows of {task!r} need a scorer of bare answers: "
                         "config:base(task=..., source=..., scorer=my_module.score)")
    source = "arithmetic" if task == "arithmetic" else "*"
    return {source: fdl.Config(FinalAnswerScorer, inner)}, {source: fdl.Config(LenientScorer, inner)}


def base(task: str = "arithmetic", settings: dict[str, Any] | None = None,
         model: str = "smollm2-135m-instruct", scorer: Any = None, steps: int = 16, lr: float = 2e-5,
         max_new_tokens: int = 64, unformatted_credit: float = 0.1, mini_batches: int = 2,
         temperature: float = 0.7, norm_by_std: bool = False, kl_coef: float = 0.0,
         sampling_rounds: int = 1, answer_last: bool = False) -> fdl.Config[Experiment]:
    """GRPO from the instruct model on `task` (module docstring): 8 prompts x 8 samples, `steps` steps.
    `kl_coef` > 0 adds a k3 KL-to-the-instruct-model loss (a frozen reference beside the actor); 0: none.
    `sampling_rounds` > 1: DAPO's dynamic sampling, up to that many rounds of 8 prompts per step until 8 groups have
    reward spread (tried at 2 on the panel: no better, docs/bring_your_own_model.md); 1: one round.
    `answer_last`: full credit only for a reply that ENDS with its answer, as the instruction asks
    (`RightAnswerReward(answer_last=True)`); held-out accuracy reads the answer as before either way."""
    model_path = fdl.Config(model_folder, model)
    tokenizer = fdl.Config(load_tokenizer, model_path)
    strict, lenient = task_scorers(task, scorer)
    reward = {source: fdl.Config(RightAnswerReward, rule, unformatted_credit=unformatted_credit, answer_last=answer_last)
              for source, rule in strict.items()}
    def evaluator(split: str, rows: int) -> fdl.Config[Evaluator]:
        return fdl.Config(
            Evaluator,
            dataset=fdl.Config(PromptDataset, rows=task_rows(task, split, rows, settings), tokenizer=tokenizer,
                               max_prompt_length=MAX_PROMPT_LENGTH, name=split),
            # accuracy: full credit from the task's scorer (partial credit for wrong answers does not count)
            reward=fdl.Config(RewardManager, scorers={s: fdl.Config(Correct, rule) for s, rule in strict.items()}),
            aux_rewards={"lenient": fdl.Config(RewardManager, scorers={s: fdl.Config(Correct, rule)
                                                                        for s, rule in lenient.items()})},
            sampling=fdl.Config(SamplingParams, temperature=0.0, max_new_tokens=max_new_tokens),
        )

    grpo = fdl.Config(
        RLTrainer,
        policy=policy_group(
            model_path=model_path,
            ref_model_path=model_path if kl_coef > 0 else None,
            objective=fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss, clip_low=0.2, clip_high=0.28),
                                 kl_loss=fdl.Config(KLLoss, estimator=kl_k3, coef=kl_coef) if kl_coef > 0 else None),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=lr, weight_decay=0.0),
            lr_scheduler=fdl.Partial(get_linear_schedule_with_warmup, num_warmup_steps=0,
                                     num_training_steps=steps * mini_batches),  # stepped per optimizer step
            # 4096 tokens a micro-batch: ~5.4 GB at the budget's longest (the memory check before the run says so)
            training=fdl.Config(TrainingSetup, micro_batch_size=64, max_tokens_per_micro_batch=4096,
                                mini_batches=mini_batches),
        ),
        tokenizer=tokenizer,
        train_data=fdl.Config(PromptDataset, rows=task_rows(task, "train", 4096, settings), tokenizer=tokenizer,
                              max_prompt_length=MAX_PROMPT_LENGTH, name="train"),
        reward=fdl.Config(RewardManager, scorers=reward),
        advantage=fdl.Config(GRPO, norm_by_std=norm_by_std),
        sampling=fdl.Config(SamplingParams, n=8, temperature=temperature, max_new_tokens=max_new_tokens),
        prompts_per_step=8,
        dynamic_sampling=fdl.Partial(DynamicSamplingAccumulator, max_attempts=sampling_rounds) if sampling_rounds > 1
        else None,
        total_steps=steps,
        evaluator=evaluator("val", VALIDATION),
        val_before_train=True,  # step 0 too: where training only hurts, best/ keeps the instruct model
        test_freq=max(1, steps // 4),  # the regression alarm and best/ need more than two validations
    )
    # the test rows, measured once before training and once on the last weights (final/; best/, the validations'
    # choice, scored lower on the panel's test rows: docs/transfer_panel.md)
    base_test = fdl.Config(EvalStage, policy=policy_group(model_path=model_path),
                           evaluator=evaluator("test", HELDOUT))
    test = fdl.Config(EvalStage, policy=policy_group(model_path=fdl.Config(StageOutput, "grpo", "checkpoint")),
                      evaluator=evaluator("test", HELDOUT))
    return fdl.Config(Experiment, name=NAME, stages={"base": base_test, "grpo": grpo, "test": test},
                      runtime=fdl.Config(RayRuntime), tracker=fdl.Config(AimTracker, repo=".aim", experiment=NAME))


def smoke(cfg: fdl.Config[Experiment]) -> None:
    """Two tiny steps that exercise the whole stage on the real model (tests): 2 prompts x 2 samples of 8 tokens,
    validation on 4 rows before and after."""
    rl = cfg.stages["grpo"]
    rl.total_steps = 2
    rl.prompts_per_step = 2
    rl.sampling.n = 2
    rl.sampling.max_new_tokens = 8
    limit_rows(rl.train_data, 16)
    for evaluator in (rl.evaluator, cfg.stages["base"].evaluator, cfg.stages["test"].evaluator):
        evaluator.sampling.max_new_tokens = 8
        limit_rows(evaluator.dataset, 4)


if __name__ == "__main__":
    from rlhf.cli.experiment import run_cli

    run_cli(sys.modules[__name__])
