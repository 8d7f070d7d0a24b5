"""Sync and async rollout take the same path: RLTrainer hands the producer a `generate` in both modes
(`RolloutProducer.rollout(generate, prompts, sampling)`); in sync mode it is the policy group's, with the
engine kept awake through the rollout and put to sleep after it."""

from __future__ import annotations

import dataclasses
import functools

import fiddle as fdl
import torch

from helpers import tiny_model_path
from rlhf.algos import PPOClipLoss
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.arithmetic import exact_match_score
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment, run_experiment
from rlhf.runtime.local import LocalRuntime
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.training import TrainingSetup
from rlhf_configs.pieces import policy_group

torch.set_num_threads(1)
CALLS: list[str] = []


@dataclasses.dataclass(frozen=True)
class TwoTurns:
    """A producer with only the `generate` path: two calls on the same weights (a second turn's shape)."""

    def __call__(self, policy, prompts, sampling):
        raise AssertionError("RLTrainer took the policy-group path instead of `rollout(generate, ...)`")

    def rollout(self, generate, prompts, sampling):
        CALLS.append("rollout")
        generate(prompts, sampling)
        return generate(prompts, sampling), {}


def test_sync_rollout_hands_the_producer_the_policy_groups_generate(tmp_path, monkeypatch):
    sleeps = []
    monkeypatch.setattr(PolicyWorker, "sleep_engine", lambda self: sleeps.append(len(CALLS)))
    woken = []
    original = PolicyWorker.generate

    @functools.wraps(original)  # keeps its dispatch mark (@shard)
    def generate(self, prompts, sampling, keep_awake=False):
        woken.append(keep_awake)
        return original(self, prompts, sampling, keep_awake=keep_awake)

    monkeypatch.setattr(PolicyWorker, "generate", generate)
    model = tiny_model_path()
    tok = fdl.Config(load_tokenizer, model)
    stage = fdl.Config(
        RLTrainer,
        policy=policy_group(model_path=model, objective=fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss)),
                            training=fdl.Config(TrainingSetup, micro_batch_size=8)),
        tokenizer=tok, train_data=fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=8), tokenizer=tok),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": exact_match_score}),
        sampling=fdl.Config(SamplingParams, n=2, max_new_tokens=4), prompts_per_step=4, total_steps=1,
        rollout=fdl.Config(TwoTurns), records=None,
    )
    run_experiment(fdl.Config(Experiment, name="path", stages={"rl": stage}, runtime=fdl.Config(LocalRuntime),
                              output_dir=str(tmp_path), progress=False))
    assert CALLS == ["rollout"]
    assert woken == [True, True] and sleeps == [1]  # awake through both calls, asleep once after the rollout
