"""A black-box agent trained by RL: an OpenAI-client calculator agent drives SmolLM2-135M-Instruct, on CPU.

The agent (`calculator_agent` below) is what a team would run in production: plain `openai` code that
offers the model a `multiply` function (`tools=`), runs the calls the model makes, sends back the results
and checks the final answer. It imports nothing of rlhf. The trainer hands each attempt an
`openai.AsyncOpenAI` whose base URL is a fresh session of the recording gateway on the live policy
(rlhf.agent_programs), so every completion the agent asks for is recorded token-exactly and trained
with the reward the agent returns. Three-digit products ("What is 482*937?") are beyond the model's own
arithmetic, but a call `multiply(482, 937)` only copies digits, and the answer only copies the tool's
result. Stages:

1. `sft`: a short warm start on demonstrations of the agent's own tool use, rendered with its tools
   (the untuned model never writes a call: GRPO alone would have no signal). Its evaluator runs before
   (the untuned model's accuracy: the base accuracy) and after it (the warm start's);
2. `grpo`: GRPO on the agent's attempts (each task's 4 attempts form its group), with the held-out
   accuracy of the agent, run greedily through the same loop, every 2 steps and at the end.

Measured (benchmarks/black_box_agent.py, 2026-11-27, one thread, load 4-9 with another session's job):
greedy held-out accuracy of the agent on 64 products 0% untuned, 50% after the 2-step warm start, 100%
after 6 GRPO steps (96.9% after 2), 20.4 minutes in all (benchmarks/results/black_box_agent-20261127-180911.json);
with another GRPO seed the same accuracies in 11.4 minutes at load 2-3 (-183259.json).

SmolLM2's chat template ignores `tools`, so the recipe renders them with `TOOLS_TEMPLATE`: SmolLM2's
ChatML plus a system paragraph listing the functions and asking for a Python-style call
(`multiply(482, 937)`, read by PythonCallParser, as `rlhf serve --tool-call-parser pythonic` does).

    python experiments/smollm2_agent.py --config fiddler:local
    python experiments/smollm2_agent.py --config fiddler:smoke --config fiddler:local
    python benchmarks/black_box_agent.py            # the measured result (docs/agents.md)
"""

from __future__ import annotations

import json
import re
import sys

import fiddle as fdl
import openai
import torch

from rlhf.agent_programs import AgentProgramRollout
from rlhf.agents.demonstrations import tool_demonstrations
from rlhf.agents.environment import environment_reward
from rlhf.agents.parsers import PythonCallParser
from rlhf.agents.tools import ToolCall
from rlhf.algos import GRPO, PPOClipLoss
from rlhf.data.generators import long_multiplication_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.sft import SFTDataset
from rlhf.models.importing import import_model
from rlhf.models.loading import load_tokenizer
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

NAME = "smollm2_agent"
DIGITS = 3

# ------------------------------------------------------------------------------------------------------
# The agent program: the production agent, unchanged (plain `openai`, nothing of rlhf).
TOOLS = [{
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiply two integers exactly.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "description": "the first factor"},
                           "b": {"type": "integer", "description": "the second factor"}},
            "required": ["a", "b"],
        },
    },
}]


def multiply(a: int, b: int) -> int:
    """Multiply two integers exactly.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


async def calculator_agent(task: dict, client: openai.AsyncOpenAI) -> float:
    """Ask the question with the calculator offered; run the calls; 1.0 if the final answer is the product."""
    messages = list(task["prompt"])
    for _ in range(3):
        reply = await client.chat.completions.create(model="smollm2", messages=messages, tools=TOOLS, max_tokens=32)
        message = reply.choices[0].message
        if not message.tool_calls:
            numbers = re.findall(r"-?\d+", (message.content or "").replace(",", ""))
            return float(bool(numbers) and numbers[-1] == str(task["ground_truth"]))
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            try:
                result = str(multiply(**json.loads(call.function.arguments)))
            except (TypeError, ValueError) as err:  # a wrong call: the model reads the error, as in production
                result = f"error: {err}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.0


# ------------------------------------------------------------------------------------------------------
# The recipe.
TOOLS_TEMPLATE = (
    "{%- set system = messages[0]['content'] if messages[0]['role'] == 'system' else "
    "'You are a helpful AI assistant named SmolLM, trained by Hugging Face' -%}"
    "{%- if tools -%}{%- set ns = namespace(text=system + '\n\nYou can call these functions:') -%}"
    "{%- for tool in tools -%}{%- set f = tool['function'] if 'function' in tool else tool -%}"
    "{%- set ns.text = ns.text + '\n' + f['name'] + '(' + (f['parameters']['properties'] | list | join(', ')) + '): '"
    " + (f['description'] or '') -%}{%- endfor -%}"
    "{%- set system = ns.text + '\nTo call one, reply with the call alone, like name(1, 2); its result comes back. '"
    " + 'Then reply with the answer.' -%}{%- endif -%}"
    "{{- '<|im_start|>system\n' + system + '<|im_end|>\n' -}}"
    "{%- for message in messages -%}{%- if not (loop.first and message['role'] == 'system') -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') -}}"
    "{%- for call in message.get('tool_calls') or [] -%}"
    "{{- call['function']['name'] + '(' + (call['function']['arguments'].values() | map('tojson') | join(', ')) + ')' -}}"
    "{%- endfor -%}{{- '<|im_end|>\n' -}}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)
"""SmolLM2's ChatML with the tools listed in the system message (identical to SmolLM2's own without tools)."""


def agent_tokenizer(model_path: str):
    """The model's tokenizer with `TOOLS_TEMPLATE`, so the agent's `tools=` reach the prompt."""
    tokenizer = load_tokenizer(model_path)
    tokenizer.chat_template = TOOLS_TEMPLATE
    return tokenizer


def multiplication_calls(row: dict) -> list[ToolCall]:
    """The call that answers a row (for the warm start's demonstrations)."""
    return [ToolCall("multiply", {}, (int(row["extra_info"]["a"]), int(row["extra_info"]["b"])))]


def agent_rollout(tokenizer: fdl.Config) -> fdl.Config:
    """The agent program as the rollout: Python-style calls, 3 turns fit well within 256 tokens after the prompt."""
    return fdl.Config(AgentProgramRollout, agent=calculator_agent, tokenizer=tokenizer,
                      tool_parser=fdl.Config(PythonCallParser), max_prompt_length=256, max_response_tokens=256,
                      attempt_timeout_s=600.0)


def heldout(tokenizer: fdl.Config, reward: fdl.Config) -> fdl.Config:
    """The agent's greedy accuracy on 64 held-out products, through the same loop."""
    rows = fdl.Config(long_multiplication_rows, n=64, digits=DIGITS, seed=0, split="test")
    return fdl.Config(
        Evaluator,
        dataset=fdl.Config(PromptDataset, rows=rows, tokenizer=tokenizer, name="heldout", raw_prompt=True),
        reward=reward,
        sampling=fdl.Config(SamplingParams, temperature=0.0, max_new_tokens=32),
        rollout=agent_rollout(tokenizer),
        prompts_per_call=64,
    )


def base() -> fdl.Config[Experiment]:
    model = fdl.Config(import_model, "smollm2-135m-instruct")
    tokenizer = fdl.Config(agent_tokenizer, model)
    reward = fdl.Config(RewardManager, scorers={"long_multiplication": environment_reward})  # the agent's return
    demonstrations = fdl.Config(
        tool_demonstrations, rows=fdl.Config(long_multiplication_rows, n=256, digits=DIGITS, seed=1, split="train"),
        calls=multiplication_calls, tools=[multiply], parser=fdl.Config(PythonCallParser), tool_schemas=TOOLS)
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
        total_steps=2,  # a partial warm start (about half right): GRPO's own gain is what this recipe shows
        evaluator=heldout(tokenizer, reward),
        val_before_train=True,  # the untuned model's accuracy
    )
    warm = fdl.Config(StageOutput, stage="sft")
    rl_tokenizer = fdl.Config(agent_tokenizer, warm)
    grpo = fdl.Config(
        RLTrainer,
        policy=policy_group(
            model_path=warm,
            objective=fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss, clip_low=0.2, clip_high=0.28)),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=2e-5, weight_decay=0.0),
            training=fdl.Config(TrainingSetup, micro_batch_size=8),
        ),
        tokenizer=rl_tokenizer,
        train_data=fdl.Config(PromptDataset, rows=fdl.Config(long_multiplication_rows, n=2000, digits=DIGITS,
                                                             seed=0, split="train"),
                              tokenizer=rl_tokenizer, name="train", raw_prompt=True),
        reward=reward,
        advantage=fdl.Config(GRPO, norm_by_std=True),
        sampling=fdl.Config(SamplingParams, n=4, temperature=0.7, max_new_tokens=32),  # per completion
        rollout=agent_rollout(rl_tokenizer),
        prompts_per_step=8,
        total_steps=6,
        records=fdl.Partial(RolloutRecorder, sample_rate=1.0),
        evaluator=heldout(rl_tokenizer, reward),
        test_freq=2,
    )
    return fdl.Config(
        Experiment,
        name=NAME,
        stages={"sft": sft, "grpo": grpo},
        runtime=fdl.Config(RayRuntime),
        tracker=fdl.Config(AimTracker, repo=".aim", experiment=NAME),
    )


def smoke(cfg: fdl.Config[Experiment]) -> None:
    """The smallest run through every stage (tests): 8 held-out tasks, 1 SFT step, 1 GRPO step of 2 tasks x 2."""
    for stage in cfg.stages.values():
        limit_rows(stage.evaluator.dataset, 8)
    limit_rows(cfg.stages["sft"].data, 16)
    grpo = cfg.stages["grpo"]
    limit_rows(grpo.train_data, 16)
    grpo.total_steps = 1
    grpo.prompts_per_step = 2
    grpo.sampling.n = 2
    grpo.test_freq = 0


if __name__ == "__main__":
    from rlhf.cli.experiment import run_cli

    run_cli(sys.modules[__name__])
