"""A small resumable RL job, run as a subprocess by test_kill_and_resume.py.

usage: python resume_job.py MODEL_PATH OUTPUT_DIR AIM_REPO [ray] [stream] [steps=N] [allow_changes] [async=MODE] [agent]
       [partial]

`stream`: the prompts come from a JSON Lines file through StreamingPromptDataset (resumed at the
stream position saved in the checkpoint) instead of an in-memory PromptDataset. `async=MODE`:
asynchronous rollout (docs/async.md): `one_step_off`, `fixed_lag_2` (two versions behind, exactly) or
`streaming` (the newest weights, at most 2 versions behind). `agent`: the rollout is an OpenAI-client agent
program (rlhf.agent_programs; tests/agents/program_agents.py's `answer_once`) scored by what it returns.
`partial`: a multi-turn environment whose conversations take 1 or 3 turns (`LongTailTurns`), rolled out with
partial rollouts (`async=partial`: conversations outlive their batch, docs/async.md).

With KILL_AT=K the job SIGKILLs itself at a deterministic point (timing-free, so the test
cannot race a fast machine): KILL_MODE=after_checkpoint right after checkpoint K is
written; KILL_MODE=mid_step in step K+1, after the update but before it is logged or saved.
KILL_MODE=fill_disk does not kill: right after checkpoint K it fills the output folder's
filesystem (a small tmpfs in the test) but for FILL_LEAVE bytes (default 64 KiB: a step's
rollout records fit, a checkpoint does not), so the next checkpoint write meets a real full disk.

Errors end the job as the command line does (`rlhf.cli.errors.one_line_errors`): one line.
"""

import os
import signal
import sys

import fiddle as fdl
import torch
from transformers import get_cosine_schedule_with_warmup

from rlhf.agent_programs import AgentProgramRollout
from rlhf.agents import AgentRollout, StepResult
from rlhf.agents.environment import environment_reward
from rlhf.algos import GRPO, KLLoss, PPOClipLoss, kl_k3
from rlhf.data.generators import arithmetic_rows
from rlhf.data.files import write_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.sources import load_rows
from rlhf.data.streaming import StreamingPromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.arithmetic import exact_match_score
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment, run_experiment
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.tracking.aim_tracker import AimTracker
from rlhf.trainers.records import RolloutRecorder
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.objectives import PolicyObjective
from rlhf_configs.async_rollout import use_async_rollout
from rlhf_configs.pieces import policy_group
from rlhf.workers.training import TrainingSetup

TOTAL_STEPS = 8


ASYNC = {
    "one_step_off": dict(max_staleness=1, weights="fixed_lag"),
    "fixed_lag_2": dict(max_staleness=2, weights="fixed_lag"),
    "streaming": dict(max_staleness=2, weights="newest"),
    "partial": dict(max_staleness=2, weights="newest", partial_rollouts=True),  # conversations outlive their batch
}


class LongTailTurns:
    """A conversation about an arithmetic row ends after 3 turns where the sum of its question's character codes is
    odd, else after 1: the long tail that keeps groups running across batches under partial rollouts."""

    def reset(self, row):
        self.turns = 3 if sum(map(ord, row["raw_prompt"][-1]["content"])) % 2 else 1
        return list(row["raw_prompt"])

    def step(self, action):
        return StepResult([{"role": "user", "content": "Again?"}], done=action.turn >= self.turns)


def graph(model: str, out: str, aim: str, ray: bool = False, steps: int = TOTAL_STEPS,
          stream: bool = False, rollout: str | None = None, agent: bool = False,
          partial: bool = False) -> fdl.Config[Experiment]:
    tokenizer = fdl.Config(load_tokenizer, model)
    train_data = fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=24), tokenizer=tokenizer)
    if stream:
        path = write_rows(arithmetic_rows(24), os.path.join(out, "train.jsonl"))
        rows = fdl.Config(load_rows, path=str(path), streaming=True)
        train_data = fdl.Config(StreamingPromptDataset, rows=rows, tokenizer=tokenizer, shuffle_buffer=8)
    stage = fdl.Config(
        RLTrainer,
        policy=policy_group(
            model_path=model,
            ref_model_path=model,
            objective=fdl.Config(
                PolicyObjective, policy_loss=fdl.Config(PPOClipLoss), kl_loss=fdl.Config(KLLoss, estimator=kl_k3, coef=0.01)
            ),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=3e-3),
            lr_scheduler=fdl.Partial(get_cosine_schedule_with_warmup, num_warmup_steps=2, num_training_steps=16),
            training=fdl.Config(TrainingSetup, micro_batch_size=8,
                                mini_batches=2),  # off-policy: old log-probs, two optimizer steps per RL step
        ),
        tokenizer=tokenizer,
        train_data=train_data,
        reward=fdl.Config(RewardManager, scorers={"arithmetic": exact_match_score}),
        advantage=fdl.Config(GRPO),
        sampling=fdl.Config(SamplingParams, n=4, max_new_tokens=6),
        prompts_per_step=4,  # 6 steps per epoch: the run crosses an epoch boundary
        total_steps=steps,
        save_freq=1,
        keep_checkpoints=2,
        records=fdl.Partial(RolloutRecorder),
    )
    if agent:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "agents"))
        from program_agents import answer_once  # a plain openai agent, as a user writes it

        stage.train_data.raw_prompt = True
        stage.rollout = fdl.Config(AgentProgramRollout, agent=answer_once, tokenizer=tokenizer)
        stage.reward = fdl.Config(RewardManager, scorers={"arithmetic": environment_reward})
    if partial:
        stage.train_data.raw_prompt = True
        stage.rollout = fdl.Config(AgentRollout, environment=LongTailTurns, tokenizer=tokenizer, max_turns=3,
                                   max_response_tokens=48)
    if rollout is not None:
        use_async_rollout(stage, **ASYNC[rollout])
    return fdl.Config(
        Experiment,
        name="resume",
        stages={"rl": stage},
        runtime=fdl.Config(RayRuntime, num_cpus=2) if ray else fdl.Config(LocalRuntime),
        tracker=fdl.Config(AimTracker, repo=aim, experiment="resume"),
        output_dir=out,
        run_name="job",
        progress=False,
    )


def install_kill_switch(kill_at: int, mode: str, out: str) -> None:
    save, step = RLTrainer.save, RLTrainer.step

    def save_then_die(self, checkpoints, n, ctx):
        path = save(self, checkpoints, n, ctx)
        if mode == "after_checkpoint" and n == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "fill_disk" and n == kill_at:
            from helpers import fill_disk  # tests/ is on the job's PYTHONPATH

            fill_disk(out, leave=int(os.environ.get("FILL_LEAVE", 2**16)))
        return path

    def step_then_die(self, prompts, needs, n, **kwargs):
        out = step(self, prompts, needs, n, **kwargs)
        if mode == "mid_step" and n == kill_at + 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    RLTrainer.save, RLTrainer.step = save_then_die, step_then_die


if __name__ == "__main__":
    from rlhf.cli.errors import one_line_errors

    torch.set_num_threads(1)
    model, out, aim, *flags = sys.argv[1:]
    if os.environ.get("KILL_AT"):
        install_kill_switch(int(os.environ["KILL_AT"]), os.environ.get("KILL_MODE", "mid_step"), out)
    steps = next((int(f.removeprefix("steps=")) for f in flags if f.startswith("steps=")), TOTAL_STEPS)
    rollout = next((f.removeprefix("async=") for f in flags if f.startswith("async=")), None)
    with one_line_errors("run the same command again to resume from the newest checkpoint"):
        run_experiment(graph(model, out, aim, ray="ray" in flags, steps=steps, stream="stream" in flags,
                             rollout=rollout, agent="agent" in flags, partial="partial" in flags),
                       allow_changes="allow_changes" in flags)
