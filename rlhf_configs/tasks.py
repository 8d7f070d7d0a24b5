"""A rule-rewarded GRPO stage on verl-format parquet files, shared by task recipes (Countdown, MATH),
MATH-format rows generated offline for their `tiny` variants, and a reward-model group to add."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import fiddle as fdl
import torch

from rlhf.algos import GRPO, KLLoss, PPOClipLoss, kl_k3
from rlhf.data.prepare import MATH_INSTRUCTION
from rlhf.data.prompts import PromptDataset
from rlhf.data.sources import load_rows
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.runtime.remote import Remote
from rlhf.trainers.evaluate import Evaluator
from rlhf.tracking.aim_tracker import AimTracker
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.reward_model import RewardModelWorker
from rlhf.workers.training import TrainingSetup
from rlhf_configs.pieces import policy_group


def grpo_experiment(name: str, stage: fdl.Config[RLTrainer]) -> fdl.Config[Experiment]:
    """One GRPO stage as an experiment: Ray runtime, runs recorded in `.aim` under `name`."""
    return fdl.Config(
        Experiment,
        name=name,
        stages={"grpo": stage},
        runtime=fdl.Config(RayRuntime),
        tracker=fdl.Config(AimTracker, repo=".aim", experiment=name),
    )


def grpo_stage(
    model: str,
    data_dir: str,
    scorers: dict[str, Callable],
    name: str,  # dataset names: "<name>-train", "<name>-test"
    max_prompt_length: int = 512,
    max_new_tokens: int = 1024,
    n: int = 5,
    prompts_per_step: int = 256,
    total_steps: int = 100,
    lr: float = 1e-6,
    kl_coef: float = 0.001,
) -> fdl.Config[RLTrainer]:
    """GRPO on `{data_dir}/train.parquet` (validated on test.parquet): PPO-clip 0.2, k3 KL loss, bf16 on one GPU."""
    tokenizer = fdl.Config(load_tokenizer, model)
    reward = fdl.Config(RewardManager, scorers=scorers)
    return fdl.Config(
        RLTrainer,
        policy=policy_group(
            model_path=model,
            ref_model_path=model,
            objective=fdl.Config(
                PolicyObjective,
                policy_loss=fdl.Config(PPOClipLoss, clip_low=0.2, clip_high=0.2),
                kl_loss=fdl.Config(KLLoss, estimator=kl_k3, coef=kl_coef),
            ),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=lr, weight_decay=0.01),
            training=fdl.Config(
                TrainingSetup,
                compute_dtype="bfloat16",  # bf16 matmuls; weights and AdamW state stay fp32
                micro_batch_size=16,  # rows per forward where no token budget applies
                max_tokens_per_micro_batch=16384,  # rows grouped by length, trimmed (verl: ppo_max_token_len_per_gpu)
                mini_batches=4,  # e.g. 256 prompts x 5 = 1280 samples per step -> 4 optimizer steps of 320
            ),
            gpus_per_worker=1,
        ),
        tokenizer=tokenizer,
        train_data=fdl.Config(
            PromptDataset,
            rows=fdl.Config(load_rows, path=f"{data_dir}/train.parquet"),
            tokenizer=tokenizer,
            max_prompt_length=max_prompt_length,
            overlong="filter",
            name=f"{name}-train",
        ),
        reward=reward,
        advantage=fdl.Config(GRPO, norm_by_std=True),
        sampling=fdl.Config(SamplingParams, n=n, temperature=1.0, max_new_tokens=max_new_tokens),
        prompts_per_step=prompts_per_step,
        total_steps=total_steps,
        evaluator=fdl.Config(
            Evaluator,
            dataset=fdl.Config(
                PromptDataset,
                rows=fdl.Config(load_rows, path=f"{data_dir}/test.parquet"),
                tokenizer=tokenizer,
                max_prompt_length=max_prompt_length,
                overlong="truncate_left",  # every test row is scored
                name=f"{name}-test",
            ),
            reward=reward,
            sampling=fdl.Config(SamplingParams, temperature=0.0, max_new_tokens=max_new_tokens),
        ),
        test_freq=10,
        val_before_train=True,
        save_freq=20,
    )


def math_like_rows(
    n: int, *, seed: int = 0, split: str = "train", data_source: str = "DigitalLearningGmbH/MATH-lighteval"
) -> list[dict]:
    """`n` short MATH-format problems (integer arithmetic and fractions to simplify) with \\boxed answers'
    references, in verl's MATH row layout; short enough for the byte-level tiny model."""
    rng = random.Random(f"math_like/{seed}/{split}")
    rows = []
    for index in range(n):
        kind = rng.randrange(3)
        a, b = rng.randint(2, 30), rng.randint(2, 30)
        if kind == 0:
            problem, answer = f"Compute ${a} + {b}$.", str(a + b)
        elif kind == 1:
            problem, answer = f"Compute ${a} \\times {b}$.", str(a * b)
        else:
            k = rng.randint(2, 5)
            g = math.gcd(a, b)
            p, q = a // g, b // g
            problem = f"Simplify $\\frac{{{a * k}}}{{{b * k}}}$."
            answer = str(p) if q == 1 else f"\\frac{{{p}}}{{{q}}}"
        rows.append({
            "data_source": data_source,
            "prompt": [{"role": "user", "content": f"{problem} {MATH_INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": index},
        })
    return rows


def use_reward_model(
    stage: fdl.Config[RLTrainer],
    model_path: str,
    weight: float = 1.0,
    tokenizer_path: str | None = None,
    max_length: int = 2048,
    rule_weight: float = 1.0,
    normalize: bool = True,
) -> None:
    """Score the stage's samples with a sequence-classification reward model too, in a group colocated with the
    policy: score = rule_weight x rule + weight x RM (RLTrainer's reward_model, reward_model_weight, rule_weight).
    rule_weight=0: the reward model alone is trained on, the rule score is still reported; a stage without a rule
    reward (`stage.reward = None`) needs no scorer at all. `normalize`: apply the reward mean and std stored with
    the model (a reward model trained here stores them; others have none and are left as they are)."""
    policy = stage.policy
    stage.train_data.raw_prompt = True  # the reward model re-renders the chat messages with its template
    stage.reward_model = fdl.Config(
        Remote,
        name="reward_model",
        worker=fdl.Config(
            RewardModelWorker,
            model_path=model_path,
            tokenizer_path=tokenizer_path,
            training=policy.worker.training,  # the policy's node: its strategy, micro-batches, compute dtype
            max_length=max_length,
            normalize=normalize,
        ),
        num_workers=policy.num_workers,
        cpus_per_worker=policy.cpus_per_worker,
        gpus_per_worker=policy.gpus_per_worker,
        colocate_with="policy",
    )
    stage.reward_model_weight = weight
    stage.rule_weight = rule_weight
