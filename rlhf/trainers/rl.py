"""The RL trainer (PPO family; GRPO by default): the driver loop of one RL stage.

generate -> reward -> old/ref log-probs (when needed) -> advantages -> actor update -> log.
The policy group does the model work; everything here is light bookkeeping on the driver.
"""

from __future__ import annotations

import time

from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from rlhf.algos import GRPO, AdvantageInputs, group_ids_from_uids
from rlhf.batch import Batch
from rlhf.data.prompts import PromptDataset
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.trainers.context import StageContext
from rlhf.trainers.evaluate import Evaluator
from rlhf.trainers.metrics import mean_over_ranks, rollout_metrics
from rlhf.trainers.scoring import score_rollout
from rlhf.trainers.timing import timed


class RLTrainer:
    """Trains the policy group with RL on prompts from `train_data`, scored by `reward`."""

    def __init__(
        self,
        policy,  # WorkerGroup of PolicyWorker (actor + rollout + reference)
        tokenizer: PreTrainedTokenizerBase,
        train_data: PromptDataset,
        reward: RewardManager,
        advantage=GRPO(),  # an advantage estimator from rlhf.algos
        sampling: SamplingParams = SamplingParams(n=8, temperature=1.0, max_new_tokens=32),
        prompts_per_step: int = 16,  # prompts per RL step; samples per step = prompts x sampling.n
        total_steps: int = 100,
        evaluator: Evaluator | None = None,
        test_freq: int = 0,  # validate every k steps (0: only at the end); always at the end
        val_before_train: bool = False,
        seed: int = 0,
    ):
        reward.check_sources(set(r["data_source"] for r in train_data.rows))
        if getattr(advantage, "requires_critic", False):
            raise ValueError(
                f"{type(advantage).__name__} needs a critic (values), and this trainer has no critic group. "
                "Use a critic-free estimator such as GRPO, or the PPO trainer with a critic."
            )
        self.policy = policy
        self.tokenizer = tokenizer
        self.train_data = train_data
        self.reward = reward
        self.advantage = advantage
        self.sampling = sampling
        self.prompts_per_step = prompts_per_step
        self.total_steps = total_steps
        self.evaluator = evaluator
        self.test_freq = test_freq
        self.val_before_train = val_before_train
        self.seed = seed

    def run(self, ctx: StageContext) -> dict:
        ctx.record({"data": {"train": self.train_data.fingerprint}})
        needs = self.policy.requirements()[0]
        if self.evaluator is not None and self.val_before_train:
            ctx.log(self.evaluator(self.policy), 0)
        prompts_iter = self.train_data.shuffled(self.prompts_per_step, self.seed)
        bar = tqdm(range(1, self.total_steps + 1), desc=ctx.name, disable=not ctx.progress, mininterval=1.0)
        metrics: dict[str, float] = {}
        for step in bar:
            metrics = self.step(next(prompts_iter), needs)
            if self.evaluator is not None and (step == self.total_steps or (self.test_freq and step % self.test_freq == 0)):
                metrics.update(self.evaluator(self.policy))
            ctx.log(metrics, step)
            bar.set_postfix(
                reward=f"{metrics['critic/score/mean']:.3f}", pg_loss=f"{metrics['actor/pg_loss']:.3f}", refresh=False
            )
        checkpoint = self.policy.save(str(ctx.out_dir / "final"))[0]
        return {"checkpoint": checkpoint, "metrics": metrics}

    def step(self, prompts: Batch, needs: dict[str, bool]) -> dict[str, float]:
        """One RL step; returns its metrics."""
        timing: dict[str, float] = {}
        start = time.perf_counter()
        with timed(timing, "gen"):
            batch = self.policy.generate(prompts, self.sampling)
        with timed(timing, "reward"):
            scores, reward_metrics = score_rollout(batch, self.tokenizer, self.reward)
            batch = batch.union(scores)
        if needs["old_log_probs"]:
            with timed(timing, "old_log_prob"):
                batch = batch.union(self.policy.compute_log_probs(batch))
        if needs["ref"]:
            with timed(timing, "ref"):
                batch = batch.union(self.policy.compute_ref_log_probs(batch))
        with timed(timing, "adv"):
            batch["token_level_rewards"] = batch["token_level_scores"]
            inputs = AdvantageInputs(
                token_level_rewards=batch["token_level_rewards"],
                response_mask=batch["response_mask"],
                group_ids=group_ids_from_uids(batch["uid"]),
            )
            batch["advantages"], batch["returns"] = self.advantage(inputs)
        with timed(timing, "update_actor"):
            actor_metrics = mean_over_ranks(self.policy.update(batch))
        timing["timing_s/step"] = time.perf_counter() - start
        tokens = float(batch["attention_mask"].sum())
        return {
            **rollout_metrics(batch, self.sampling.max_new_tokens),
            **reward_metrics,
            **actor_metrics,
            **timing,
            "perf/throughput": tokens / timing["timing_s/step"] / self.policy.world_size,
            "perf/total_num_tokens": tokens,
        }
