"""The RLHF pipeline on a real model: preference pairs labelled by a gold rule, a reward model learned from them,
then GRPO against the learned reward model with a KL penalty, the gold rule watching beside it.

The gold rule (`rlhf.rewards.direct_answer`) prefers answers that open by naming what was asked about ("What is a
comet?" -> "A comet is ..."): style, read from the answer's first three words, so length says nothing about it.
SmolLM2-135M-Instruct opens that way in 82% of its greedy answers to the 273 held-out prompts
(`rlhf.data.generators.topic_prompt_rows`: 12 ways of asking about ~140 things).

    samples  the instruct model answers each training prompt 4 times; the gold rule scores the answers
    rm       pairs (a prompt's best and worst answer by the rule, 20% held out) train a reward model: a one-label
             head on the instruct model, Bradley-Terry (RewardModelTrainer); held-out rm/accuracy
    grpo     the instruct model against the learned reward model alone (rule_weight=0: the gold rule is scored and
             logged as reward/rule/mean beside reward/model/mean, never trained on), k3 KL to the instruct model;
             validated greedily on held-out prompts by the gold rule (val-core/direct_answer/reward/mean@1), so a
             reward model that is gamed shows as its score rising while the gold falls (the regression alarm)
    dpo      the instruct model trained by DPO (sigmoid loss, beta 0.1, lr 2e-5, the instruct model the reference) on the same
             training pairs, validated on the held-out pairs (rewards/accuracies) and by the same gold evaluator

    python experiments/smollm2_rlhf.py                          # Ray, Aim, progress bars (CPU, fp32)
    python experiments/smollm2_rlhf.py --config fiddler:local   # in-process
    python experiments/smollm2_rlhf.py --config fiddler:smoke   # a few tiny steps of every stage (tests)

The pairs can also be made by the command line: `rlhf data prepare preferences --model MODEL --data PROMPTS
--scorer rlhf.rewards.direct_answer:direct_answer_score --samples 4 --out pairs/` (docs/preferences.md).
"""

from __future__ import annotations

import json
import sys

import fiddle as fdl
import torch
from transformers import get_linear_schedule_with_warmup

from rlhf.algos import GRPO, KLLoss, PPOClipLoss, kl_k3
from rlhf.cli.prepare_preferences import split_pairs
from rlhf.data.generators import topic_prompt_rows
from rlhf.data.preferences import preference_pairs
from rlhf.data.prompts import PromptDataset
from rlhf.models.importing import model_folder
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.direct_answer import direct_answer_score
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.runtime.remote import StageOutput
from rlhf.tracking.aim_tracker import AimTracker
from rlhf.trainers.evaluate import Evaluator
from rlhf.trainers.generate import GenerationStage
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.training import TrainingSetup
from rlhf_configs.dpo import dpo_stage, preference_loss
from rlhf_configs.pieces import policy_group
from rlhf_configs.reward_model import rm_stage
from rlhf_configs.rows import limit_rows
from rlhf_configs.tasks import use_reward_model

NAME = "smollm2_rlhf"
MAX_PROMPT_LENGTH = 64
"""The prompts are ~45 tokens with SmolLM2's default system prompt."""
MAX_NEW_TOKENS = 32
"""Answers are cut here in every stage: the rule reads three words, and short answers keep each stage in minutes."""
HELDOUT_PAIRS = 0.2
"""Share of the pairs the reward model is validated on (never trained on)."""


def gold_reward() -> fdl.Config[RewardManager]:
    """The gold rule on the prompts' data_source."""
    return fdl.Config(RewardManager, scorers={"direct_answer": direct_answer_score})


def labelled_pairs(generations: str, split: str, test_fraction: float = HELDOUT_PAIRS, seed: int = 0,
                   length_balanced: bool = True) -> list[dict]:
    """Preference rows from a GenerationStage's scored samples: each prompt's best and worst answer by the gold
    rule (`pairs_from_samples`; prompts whose answers all score the same give none), `split` "train" or "test"
    of a seeded `test_fraction` split (the same one `rlhf data prepare preferences --length-matched` makes).
    `length_balanced`: among tied answers, the pairs are chosen so that the chosen answer is the longer in about
    half of them (the closest in length on that side): length alone cannot label the pairs, so the reward model
    and DPO cannot learn "longer is better" from them (`preference_pairs`)."""
    with open(generations, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    pairs = preference_pairs(rows, [row["scores"] for row in rows], length_balanced=length_balanced)
    train, test = split_pairs([p for p in pairs if p is not None], test_fraction, seed)
    return train if split == "train" else test


def base(model: str = "smollm2-135m-instruct", prompts: int = 1131, samples: int = 4, rm_steps: int = 80,
         rm_lr: float = 3e-5, rl_steps: int = 24, rl_lr: float = 2e-5, kl_coef: float = 0.05, dpo_steps: int = 40, dpo_lr: float = 2e-5,
         dpo_beta: float = 0.1, dpo_loss: str = "sigmoid", generations: str | None = None) -> fdl.Config[Experiment]:
    """samples -> rm -> grpo, and samples -> dpo, fp32 on CPU; `prompts` training prompts answered `samples`
    times for the pairs; `generations`: pairs from this scored `generations.jsonl` of an earlier run's samples stage
    (or `rlhf generate` with the gold scorer) instead of a samples stage; `dpo_loss` a loss of the DPO family by its
    command-line name (`rlhf_configs.dpo.LOSSES`: sigmoid, robust, ipo, simpo, rpo), with beta `dpo_beta`."""
    model_path = fdl.Config(model_folder, model)
    tokenizer = fdl.Config(load_tokenizer, model_path)

    def prompt_data(split: str, n: int | None, name: str, **options) -> fdl.Config[PromptDataset]:
        return fdl.Config(PromptDataset, rows=fdl.Config(topic_prompt_rows, n=n, split=split), tokenizer=tokenizer,
                          max_prompt_length=MAX_PROMPT_LENGTH, name=name, **options)

    samples_stage = fdl.Config(
        GenerationStage,
        policy=policy_group(model_path=model_path, training=fdl.Config(TrainingSetup, micro_batch_size=64)),
        dataset=prompt_data("train", prompts, "pair-prompts"),
        sampling=fdl.Config(SamplingParams, n=samples, temperature=1.0, max_new_tokens=MAX_NEW_TOKENS),
        prompts_per_call=64,
        reward=gold_reward(),
    )
    samples = {"samples": samples_stage} if generations is None else {}
    generations = generations or fdl.Config(StageOutput, stage="samples", key="generations")
    rm = rm_stage(model_path, fdl.Config(labelled_pairs, generations=generations, split="train"),
                  fdl.Config(labelled_pairs, generations=generations, split="test"),
                  steps=rm_steps, batch_size=16, micro_batch_size=32, lr=rm_lr, warmup_steps=5,
                  max_length=MAX_PROMPT_LENGTH + MAX_NEW_TOKENS + 8, test_freq=max(1, rm_steps // 4))
    def gold_evaluator() -> fdl.Config[Evaluator]:  # greedy answers to held-out prompts, scored by the gold rule
        return fdl.Config(Evaluator, dataset=prompt_data("test", None, "heldout"), reward=gold_reward(),
                          sampling=fdl.Config(SamplingParams, temperature=0.0, max_new_tokens=MAX_NEW_TOKENS))

    dpo = dpo_stage(model_path, fdl.Config(labelled_pairs, generations=generations, split="train"),
                    fdl.Config(labelled_pairs, generations=generations, split="test"),
                    loss=preference_loss(dpo_loss, beta=dpo_beta), steps=dpo_steps, batch_size=16, micro_batch_size=16,
                    lr=dpo_lr, warmup_steps=5, max_length=MAX_PROMPT_LENGTH + MAX_NEW_TOKENS + 8,
                    test_freq=max(1, dpo_steps // 4), evaluator=gold_evaluator())
    grpo = fdl.Config(
        RLTrainer,
        policy=policy_group(
            model_path=model_path,
            ref_model_path=model_path,
            objective=fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss, clip_low=0.2, clip_high=0.28),
                                 kl_loss=fdl.Config(KLLoss, estimator=kl_k3, coef=kl_coef)),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=rl_lr, weight_decay=0.0),
            lr_scheduler=fdl.Partial(get_linear_schedule_with_warmup, num_warmup_steps=0, num_training_steps=rl_steps),
            training=fdl.Config(TrainingSetup, micro_batch_size=64),
        ),
        tokenizer=tokenizer,
        train_data=prompt_data("train", None, "train"),
        reward=gold_reward(),  # scored and logged (reward/rule/mean), not trained on: rule_weight=0 below
        advantage=fdl.Config(GRPO, norm_by_std=True),
        sampling=fdl.Config(SamplingParams, n=8, temperature=1.0, max_new_tokens=MAX_NEW_TOKENS),
        prompts_per_step=8,
        total_steps=rl_steps,
        evaluator=gold_evaluator(),
        test_freq=max(1, rl_steps // 4),
        val_before_train=True,
    )
    use_reward_model(grpo, fdl.Config(StageOutput, stage="rm"), weight=1.0, rule_weight=0.0,
                     max_length=MAX_PROMPT_LENGTH + MAX_NEW_TOKENS + 8)
    return fdl.Config(
        Experiment,
        name=NAME,
        stages={**samples, "rm": rm, "grpo": grpo, "dpo": dpo},
        runtime=fdl.Config(RayRuntime),
        tracker=fdl.Config(AimTracker, repo=".aim", experiment=NAME),
    )


def smoke(cfg: fdl.Config[Experiment]) -> None:
    """A few tiny steps of every stage on the real model (tests): 16 prompts x 2 samples of 6 tokens, 2 reward-model
    steps, 2 GRPO steps of 2 prompts x 2 samples, validation on 4 prompts."""
    rm, grpo, dpo = (cfg.stages[name] for name in ("rm", "grpo", "dpo"))
    samples = cfg.stages.get("samples")
    if samples is not None:
        limit_rows(samples.dataset, 16)
        samples.sampling.n = 2
        samples.sampling.max_new_tokens = 6
    for stage in (grpo, grpo.evaluator, dpo.evaluator):
        stage.sampling.max_new_tokens = 6
    rm.total_steps = 2
    rm.batch_size = 2
    rm.test_freq = 0
    rm.val_data = None  # 16 prompts leave too few pairs to hold any out
    rm.rm.worker.lr_scheduler.num_training_steps = 2
    grpo.total_steps = 2
    grpo.prompts_per_step = 2
    grpo.sampling.n = 2
    grpo.test_freq = 0
    limit_rows(grpo.train_data, 16)
    limit_rows(grpo.evaluator.dataset, 4)
    dpo.total_steps = 2
    dpo.batch_size = 2
    dpo.test_freq = 0
    dpo.val_data = None
    dpo.policy.worker.lr_scheduler.num_training_steps = 2
    limit_rows(dpo.evaluator.dataset, 4)


if __name__ == "__main__":
    from rlhf.cli.experiment import run_cli

    run_cli(sys.modules[__name__])
