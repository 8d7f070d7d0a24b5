"""The RL trainer (PPO family: GRPO, PPO with a critic, ...): the driver loop of one RL stage.

generate -> reward -> old/ref/teacher log-probs (when needed) -> rollout correction -> values -> KL
penalty -> advantages -> PF-PPO resampling -> critic update -> actor update -> validate -> log -> checkpoint.
Worker groups do the model work; everything here is light bookkeeping on the driver. After each
update the rollout engine needs the new weights: free for the HF engine, which generates with the
actor's own module, but a full copy streamed in buckets for vLLM (docs/rollout_engines.md). Each
validation is watched (rlhf.trainers.heldout_watch): the best one's weights are kept as `best/` (the
stage's `selected_checkpoint`, what to take after an alarm; `final/` without validations), and
a held-out score falling while the training score rises, or staying below its start, prints a warning
(docs/debugging.md). With
`async_rollout` the first two phases run ahead in a rollout group of their own and each step takes
its batch from that queue (rlhf.trainers.async_rollout, docs/async.md).

Each algorithm variant is one argument (one graph node): the estimator (`advantage`, whose needs
come from `rlhf.algos.requirements`: a greedy baseline rollout for ReMax, token statistics for the
optimal token baseline, the student's and a teacher's log-probs for on-policy distillation),
`rollout_correction`, `dynamic_sampling` (DAPO) and `pf_ppo`. The policy loss lives in the policy
worker's objective; overlong shaping in the reward manager.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from rlhf.algos import (
    GRPO,
    AdvantageInputs,
    DynamicSamplingAccumulator,
    RolloutCorrection,
    apply_kl_penalty,
    distillation_metrics,
    group_ids_from_uids,
    kl_k1,
    pf_ppo_resample,
    zero_advantage_rows,
)
from rlhf.agents.partial import PartialRollouts
from rlhf.algos.pf_ppo import Weighting
from rlhf.algos.requirements import estimator_needs, setup_problems
from rlhf.batch import Batch
from rlhf.data.prompts import PromptDataset
from rlhf.ranges import NonNegativeInt, PositiveFloat, PositiveInt
from rlhf.data.streaming import StreamingPromptDataset
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.trainers.async_rollout import AsyncRollout, SyncRollout
from rlhf.trainers.checkpoint import CheckpointManager
from rlhf.trainers.context import StageContext
from rlhf.trainers.dynamic_sampling import collect_groups_with_variance, concat_rollouts
from rlhf.trainers.evaluate import Evaluator
from rlhf.trainers.heldout_watch import BestHeldout, HeldoutWatch, RegressionAlarm
from rlhf.trainers.metrics import mean_over_ranks, rollout_metrics
from rlhf.trainers.records import RolloutRecorder, truncate_records
from rlhf.trainers.rollout_producer import RolloutProducer, SingleTurn
from rlhf.trainers.scoring import score_rollout
from rlhf.trainers.time_budget import TimeBudget
from rlhf.trainers.timing import timed
from rlhf.workers.policy_group import PolicyGroup


BEST_FILE = "best.json"
"""Beside `best/`: the step and held-out score of the weights in it (what a resumed stage starts its best from)."""


class NonFiniteTrainingError(FloatingPointError):
    """Gradients were NaN/Inf for too many consecutive steps; the weights were never touched."""


def _refuse_bad_setups(train_data, reward: RewardManager | None, advantage, sampling: SamplingParams, *, critic,
                       dynamic_sampling, reward_model, partial_rollouts: tuple = (None, None)) -> None:
    """Raise ValueError for what RLTrainer cannot run (the same setups preflight refuses), before any model work.
    `partial_rollouts`: (rollout, async_rollout), checked when the async rollout continues conversations."""
    rollout, async_rollout = partial_rollouts
    if async_rollout is not None and async_rollout.partial_rollouts:
        _refuse_partial_rollouts(rollout, advantage, dynamic_sampling)
    if reward is None and reward_model is None:
        raise ValueError("RLTrainer: reward=None needs a reward model to score the samples (reward_model=...: "
                         "rlhf_configs.tasks.use_reward_model, or --config 'fiddler:reward_model(path=...)').")
    if reward is not None:
        reward.check_sources(train_data.data_sources)
        reward.check_generation_limit(sampling.max_new_tokens)  # overlong shaping reads it from each rollout
    problems = setup_problems(advantage, n=sampling.n, has_critic=critic is not None,
                              dynamic_sampling=dynamic_sampling is not None)
    if problems:
        raise ValueError("RLTrainer: " + " ".join(f"{p.field}: {p.message}" for p in problems))
    if reward_model is not None and not getattr(train_data, "raw_prompt", False):
        raise ValueError(
            "RLTrainer.reward_model re-renders each prompt with its own chat template, so it needs the "
            "chat messages: build train_data with PromptDataset(raw_prompt=True)."
        )


def _refuse_partial_rollouts(rollout, advantage, dynamic_sampling) -> None:
    """Raise ValueError where partial rollouts cannot run: they carry multi-turn conversations between batches, so
    a batch is the groups that ended first, not one call's answers to its own prompts."""
    PartialRollouts(rollout)  # an AgentRollout, or a ValueError saying why not
    if dynamic_sampling is not None:
        raise ValueError("RLTrainer: dynamic_sampling (DAPO's rounds) with AsyncRollout(partial_rollouts=True): the rounds "
                         "re-run the step's prompts, which partial rollouts may still hold running; turn one off")
    if estimator_needs(advantage).baseline_rollout:
        raise ValueError("RLTrainer: ReMax's greedy baseline rollout with AsyncRollout(partial_rollouts=True): the "
                         "baseline answers the step's prompts, but the batch holds the groups that ended first; use "
                         "GRPO-style group baselines or turn partial rollouts off")


class RLTrainer:
    """Trains the policy group with RL on prompts from `train_data`, scored by `reward`."""

    def __init__(
        self,
        policy: PolicyGroup,  # the WorkerGroup of PolicyWorkers (actor + rollout + reference)
        tokenizer: PreTrainedTokenizerBase,
        train_data: PromptDataset | StreamingPromptDataset,
        reward: RewardManager | None,  # the rule reward; None: the reward model alone scores (needs `reward_model`)
        advantage=GRPO(),  # an advantage estimator from rlhf.algos
        sampling: SamplingParams = SamplingParams(n=8, temperature=1.0, max_new_tokens=32),
        prompts_per_step: PositiveInt = 16,  # prompts per RL step; samples per step = prompts x sampling.n
        total_steps: PositiveInt = 100,
        critic=None,  # WorkerGroup of CriticWorker; required by estimators with requires_critic (GAE)
        critic_warmup: NonNegativeInt = 0,  # steps that train only the critic before the actor starts
        kl_in_reward=None,  # FixedKLController / AdaptiveKLController: KL penalty in the reward; None: off
        kl_estimator=kl_k1,  # per-token KL estimator of the reward penalty
        evaluator: Evaluator | None = None,
        test_freq: NonNegativeInt = 0,  # validate every k steps (0: only at the end); always at the end
        val_before_train: bool = False,
        # the validation metric that picks `best/` and is watched for a gamed reward (higher is better); None: the
        # evaluator's main reward mean, `val-core/<source>/reward/mean@<n>` (name one if the rows have several sources)
        heldout_metric: str | None = None,
        # warns when the held-out score falls while the training score rises, or stays below its start
        # (rlhf.trainers.heldout_watch): a factory, the class or fdl.Partial(RegressionAlarm, evaluations=K,
        # margin=...); None: off
        regression_alarm: Callable[[], RegressionAlarm] | None = RegressionAlarm,
        save_freq: NonNegativeInt = 0,  # full checkpoint every k steps and at the end (0: none; `final/` is always written)
        keep_checkpoints: PositiveInt = 2,  # complete checkpoints kept (oldest deleted)
        max_nonfinite_steps: PositiveInt = 3,  # consecutive steps with NaN/Inf gradients before stopping
        # rollouts written to <stage dir>/rollouts.jsonl (`rlhf rollouts show|view`): a factory, the class or
        # fdl.Partial(RolloutRecorder, max_groups_per_step=...); None: not recorded
        records: Callable[[], RolloutRecorder] | None = RolloutRecorder,
        reward_model=None,  # WorkerGroup of RewardModelWorker: its score is added to the rule score
        reward_model_weight: float = 1.0,  # score = rule_weight * rule score + reward_model_weight * reward-model score
        # the rule score's weight beside a reward model; 0: the rule is reported (reward/rule/mean, rollout records)
        # but not trained on, e.g. a gold rule watching a learned reward model
        rule_weight: float = 1.0,
        rollout_correction: RolloutCorrection | None = None,  # TIS / rejection (MIS) of the rollout-trainer mismatch
        # DAPO dynamic sampling: fdl.Partial(DynamicSamplingAccumulator, max_attempts=k) (the trainer passes
        # target_num_groups=prompts_per_step); None: off
        dynamic_sampling: Callable[..., DynamicSamplingAccumulator] | None = None,
        pf_ppo: Weighting | None = None,  # PF-PPO: resample the batch by a weighting of the scores (PowWeights())
        rollout: RolloutProducer = SingleTurn(),  # makes each batch: one generate, or rlhf.agents.AgentRollout (multi-turn)
        # rollouts from a group of their own, up to max_staleness policy versions behind the trainer (docs/async.md;
        # the loss needs the behaviour log-probs: rollout_correction or PolicyObjective.decoupled); None: each
        # step generates with the policy's engine
        async_rollout: AsyncRollout | None = None,
        max_train_minutes: PositiveFloat | None = None,  # stop after the step that spends it (TimeBudget); None: off
        seed: NonNegativeInt = 0,
    ):
        _refuse_bad_setups(train_data, reward, advantage, sampling, critic=critic, dynamic_sampling=dynamic_sampling,
                           reward_model=reward_model, partial_rollouts=(rollout, async_rollout))
        self.policy = policy
        self.tokenizer = tokenizer
        self.train_data = train_data
        self.reward = reward
        self.advantage = advantage
        self.sampling = sampling
        self.prompts_per_step = prompts_per_step
        self.total_steps = total_steps
        self.critic, self.critic_warmup = critic, critic_warmup
        self.kl_in_reward, self.kl_estimator = kl_in_reward, kl_estimator
        self.evaluator = evaluator
        self.test_freq, self.val_before_train = test_freq, val_before_train
        self.heldout = self._heldout_watch(evaluator, heldout_metric, regression_alarm)
        self.save_freq, self.keep_checkpoints = save_freq, keep_checkpoints
        self.max_nonfinite_steps = max_nonfinite_steps
        self.records = records() if records is not None else None
        self.reward_model, self.reward_model_weight, self.rule_weight = reward_model, reward_model_weight, rule_weight
        self.rollout_correction = rollout_correction
        self.dynamic_sampling = dynamic_sampling
        self.pf_ppo = pf_ppo
        self.rollout = rollout
        self.async_rollout = async_rollout
        self.estimator_needs = estimator_needs(advantage)
        self.seed = seed
        self.budget = TimeBudget(max_train_minutes)
        self._rollouts: SyncRollout | AsyncRollout | None = None  # where the current run's steps take their batches
        self._data_position = None  # a streaming dataset's position, restored from a checkpoint
        self._resumed_rollout = None  # the asynchronous queue's state and the checkpoint folder holding it
        self._metrics: dict[str, float] = {}  # the last step's metrics (saved with each checkpoint)

    # ---------------------------------------------------------------- loop
    def run(self, ctx: StageContext) -> dict:
        checkpoints = CheckpointManager(ctx.out_dir / "checkpoints", keep=self.keep_checkpoints)
        checkpoints.remove_partial()  # what a kill during a save left behind
        start = self.restore(checkpoints, ctx) if ctx.resume else 0
        ctx.record({"data": {"train": self.train_data.fingerprint}})
        columns = self.policy.requirements()[0]
        if self.evaluator is not None and self.val_before_train and start == 0:
            ctx.log(self._validate(0, ctx), 0)
        self._rollouts = self._rollout_source(start)
        try:
            metrics, step = self._train(self._rollouts, columns, start, checkpoints, ctx)
        finally:
            self._rollouts.close()
        checkpoint = self.policy.save(str(ctx.out_dir / "final"))[0]
        best = self.heldout.result() if self.heldout is not None else {}
        if best:  # the weights of the best evaluation, beside final/ (`rlhf export <stage>/best OUT`)
            best["best_checkpoint"] = str(ctx.out_dir / "best")
        # the validations' choice for a later stage (after a collapse or regression alarm): best/, else final/
        selected = best.get("best_checkpoint", checkpoint)
        return {"checkpoint": checkpoint, "selected_checkpoint": selected, "metrics": metrics, **best,
                **self.budget.stopped_early(step, self.total_steps)}

    @staticmethod
    def _heldout_watch(evaluator: Evaluator | None, metric: str | None,
                       alarm: Callable[[], RegressionAlarm] | None) -> HeldoutWatch | None:
        """What the validations are watched for: the best step and a gamed reward (None without an evaluator)."""
        if evaluator is None:
            return None
        metric = metric or evaluator.main_metric
        if metric is None:
            sources = ", ".join(sorted(evaluator.dataset.data_sources))
            raise ValueError(
                f"RLTrainer: the held-out rows have several data sources ({sources}), "
                "so which score picks best/ and is watched for a gamed reward must be named: set heldout_metric, "
                "e.g. 'val-core/<source>/reward/mean@<n>'."
            )
        return HeldoutWatch(metric, alarm() if alarm is not None else None)

    def _validate(self, step: int, ctx: StageContext) -> dict[str, float]:
        """The held-out metrics at `step`; a new best is saved as `best/` (atomically, like final/), and a
        held-out score falling while the training score rises prints a warning."""
        metrics = self.evaluator(self.policy)
        verdict = self.heldout.evaluated(step, metrics)
        if verdict.new_best:  # the folder first: best.json never names weights that are not there yet
            self.policy.save(str(ctx.out_dir / "best"))
            tmp = ctx.out_dir / f".{BEST_FILE}.tmp"
            tmp.write_text(json.dumps({"metric": self.heldout.metric, **dataclasses.asdict(self.heldout.best)}))
            os.replace(tmp, ctx.out_dir / BEST_FILE)
        if verdict.warning is not None:
            tqdm.write(verdict.warning, file=sys.stderr)
        return {**metrics, **verdict.metrics}

    def _train(self, rollouts: SyncRollout | AsyncRollout, columns: dict[str, bool], start: int,
               checkpoints: CheckpointManager, ctx: StageContext) -> tuple[dict[str, float], int]:
        """Steps start+1 .. total_steps, or to the step that spends `max_train_minutes` (step, validate, log,
        record, checkpoint); the last step's metrics and number."""
        end = start if self.budget.exhausted else self.total_steps  # resumed after the budget was spent: no steps
        bar = tqdm(
            range(start + 1, end + 1), initial=start, total=self.total_steps,
            desc=ctx.name, disable=not ctx.progress, mininterval=1.0,
        )
        metrics = self._metrics  # a run resumed at its last step reports that step's metrics
        bad_steps = 0
        step = start
        for step in bar:
            metrics, batch = self.step(rollouts, columns, step)
            metrics.update(self.budget.spend(metrics))
            last = step == self.total_steps or self.budget.exhausted
            if self.heldout is not None and "critic/score/mean" in metrics:
                self.heldout.after_step(metrics["critic/score/mean"])
            bad_steps = bad_steps + 1 if metrics.get("actor/nonfinite_steps") or metrics.get("critic/nonfinite_steps") else 0
            if bad_steps >= self.max_nonfinite_steps:
                raise NonFiniteTrainingError(
                    f"gradients were NaN/Inf in {bad_steps} consecutive steps (up to step {step}); those updates "
                    "were skipped and no checkpoint with non-finite weights was written. Lower the learning rate, "
                    "check rewards for NaN, or raise RLTrainer.max_nonfinite_steps."
                )
            if self.evaluator is not None and (last or (self.test_freq and step % self.test_freq == 0)):
                metrics.update(self._validate(step, ctx))
            ctx.log(metrics, step)
            self._metrics = metrics
            if self.records is not None:
                self.records.write(ctx.out_dir, step, batch, batch["response_text"],
                                   functools.partial(self._prompt_texts, batch), self.tokenizer)
            if self.save_freq and (step % self.save_freq == 0 or last):
                self.save(checkpoints, step, ctx)
            bar.set_postfix(
                reward=f"{metrics['critic/score/mean']:.3f}", pg_loss=f"{metrics.get('actor/pg_loss', 0.0):.3f}",
                refresh=False,
            )
            if last:
                break
        return metrics, step

    def _rollout_source(self, start: int) -> SyncRollout | AsyncRollout:
        """Where the steps after `start` take their scored batches: made when a step asks, with the policy
        group's own engine (synchronous), or taken from the asynchronous rollout's queue."""

        def prompts_from(drawn: int, position=None):
            if position is not None:  # a stream resumes at its recorded position, not by replaying
                return self.train_data.shuffled(self.prompts_per_step, self.seed, drawn, position=position)
            return self.train_data.shuffled(self.prompts_per_step, self.seed, start_step=drawn)

        if self.async_rollout is None:
            # the policy group's engine stays awake through a rollout's calls (turns); `_produce` puts it to sleep
            produce = functools.partial(self._rollout, generate=functools.partial(self.policy.generate, keep_awake=True))
            return SyncRollout(produce, prompts_from(start, self._data_position))
        carry = PartialRollouts(self.rollout) if self.async_rollout.partial_rollouts else None
        return self.async_rollout.start(policy=self.policy, produce=self._rollout, prompts_from=prompts_from,
                                        start_step=start, total_steps=self.total_steps, seed=self.seed,
                                        resumed=self._resumed_rollout, carry=carry)

    def step(self, rollouts: SyncRollout | AsyncRollout, columns: dict[str, bool], step: int) -> tuple[dict[str, float], Batch]:
        """One RL step on the batch `rollouts` hands over; returns its metrics and the scored batch. `columns`: the
        ones the policy asks for before its update (`PolicyWorker.requirements`)."""
        timing: dict[str, float] = {}
        start = time.perf_counter()
        batch, reward_metrics = rollouts.take(step, timing)
        correcting = self.rollout_correction is not None
        # bypass mode without rejections trains against the engine's log-probs: no old-log-prob pass
        bypass = correcting and self.rollout_correction.bypass and not self.rollout_correction.rejections
        live_rows_only = self._old_log_probs_for_live_rows_only(columns, correcting)
        if self.estimator_needs.token_statistics:
            with timed(timing, "old_log_prob"):
                batch = batch.union(self.policy.compute_token_stats(batch))
        elif (((columns["old_log_probs"] or correcting) and not bypass) or self.kl_in_reward is not None
              or self.estimator_needs.old_log_probs) and not live_rows_only:
            with timed(timing, "old_log_prob"):
                batch = batch.union(self.policy.compute_log_probs(batch))
        if columns["ref_log_probs"] or self.kl_in_reward is not None:
            with timed(timing, "ref"):
                batch = batch.union(self.policy.compute_ref_log_probs(batch))
        distill_metrics = {}
        if self.estimator_needs.teacher_log_probs:  # on-policy distillation: the teacher scores every sampled token
            with timed(timing, "teacher"):
                batch = batch.union(self.policy.compute_teacher_log_probs(batch))
            distill_metrics = {f"distill/{k}": v for k, v in distillation_metrics(
                batch["old_log_probs"], batch["teacher_log_probs"], batch["response_mask"]).items()}
        correction_metrics = self._correct_rollout(batch) if correcting else {}
        if self.critic is not None:
            with timed(timing, "values"):
                batch = batch.union(self.critic.compute_values(batch))
        with timed(timing, "adv"):
            kl_metrics = self._rewards(batch)
            batch["advantages"], batch["returns"] = self.advantage(self._advantage_inputs(batch))
        if live_rows_only:
            with timed(timing, "old_log_prob"):
                batch = batch.union(self._old_log_probs_of_live_rows(batch))
        pf_metrics = {}
        if self.pf_ppo is not None:
            batch, pf_metrics = self._pf_ppo_resample(batch, step)
        update_metrics: dict[str, float] = {}
        if self.critic is not None:
            with timed(timing, "update_critic"):
                update_metrics.update(mean_over_ranks(self.critic.update(batch)))
        if step > self.critic_warmup:
            with timed(timing, "update_actor"):
                update_metrics.update(mean_over_ranks(self.policy.update(batch)))
        update_metrics.update(rollouts.after_update(step, timing))  # async: the new weights go to the rollout side
        timing["timing_s/step"] = time.perf_counter() - start
        tokens = float(batch["attention_mask"].sum())
        metrics = {
            **rollout_metrics(batch, batch.require_meta("max_new_tokens", "RLTrainer")),
            **reward_metrics,
            **correction_metrics,
            **kl_metrics,
            **distill_metrics,
            **pf_metrics,
            **update_metrics,
            **timing,
            "perf/throughput": tokens / timing["timing_s/step"] / self.policy.world_size,
            "perf/total_num_tokens": tokens,
        }
        return metrics, batch

    def _rollout(
        self, prompts: Batch, more_prompts: Callable[[], Batch] | None, timing: dict[str, float], *,
        generate: Callable[[Batch, SamplingParams], Batch], carry: PartialRollouts | None = None,
    ) -> tuple[Batch, dict[str, float]]:
        """The step's scored samples: one round, or DAPO's rounds until enough groups with reward spread.
        `generate`: the policy group's, or the rollout group's in asynchronous rollout; `carry`: partial rollouts'
        pool (the batch is the groups that ended first, `more_prompts` feeds the pool)."""
        if carry is not None:
            return self._generate_and_score(prompts, timing, generate, carry=carry, more_prompts=more_prompts)
        if self.dynamic_sampling is None:
            return self._generate_and_score(prompts, timing, generate)
        rounds: list[dict[str, float]] = []

        def one_round() -> Batch:
            batch, metrics = self._generate_and_score(prompts if not rounds else more_prompts(), timing, generate)
            rounds.append(metrics)
            return batch

        accumulator = self.dynamic_sampling(target_num_groups=self.prompts_per_step, concat=concat_rollouts)
        batch, metrics = collect_groups_with_variance(one_round, accumulator)
        for key in rounds[0]:  # rounds' reward metrics, averaged
            metrics[key] = sum(r.get(key, 0.0) for r in rounds) / len(rounds)
        return batch, metrics

    def _produce(
        self, prompts: Batch, sampling: SamplingParams, generate: Callable[[Batch, SamplingParams], Batch],
        carry: PartialRollouts | None = None, more_prompts: Callable[[], Batch] | None = None,
    ) -> tuple[Batch, dict[str, float]]:
        """The rollout producer's batch and metrics with `generate`, in sync and async mode alike: the policy
        group's (its engine kept awake between the rollout's calls, then put to sleep for the update) or, in
        asynchronous rollout, the rollout group's."""
        try:
            if carry is not None:
                return carry.rollout(generate, prompts, sampling, more_prompts)
            return self.rollout.rollout(generate, prompts, sampling)
        finally:
            if self.async_rollout is None:
                self.policy.sleep_engine()

    def _generate_and_score(
        self, prompts: Batch, timing: dict[str, float], generate: Callable[[Batch, SamplingParams], Batch],
        carry: PartialRollouts | None = None, more_prompts: Callable[[], Batch] | None = None,
    ) -> tuple[Batch, dict[str, float]]:
        with timed(timing, "gen"):
            batch, produced = self._produce(prompts, self.sampling, generate, carry, more_prompts)
        with timed(timing, "reward"):
            scores, metrics = score_rollout(batch, self.tokenizer, self.reward, self.reward_model,
                                            self.reward_model_weight, self.rule_weight)
            batch = batch.union(scores)
        metrics.update(produced)
        if self.estimator_needs.baseline_rollout:  # ReMax: the greedy response's score is each sample's baseline
            with timed(timing, "gen_max"):
                greedy = self._produce(prompts, dataclasses.replace(self.sampling, n=1, temperature=0.0), generate)[0]
                baseline = score_rollout(greedy, self.tokenizer, self.reward, self.reward_model,
                                         self.reward_model_weight, self.rule_weight)[0]["scores"]
            batch["baseline_rewards"] = baseline.repeat_interleave(self.sampling.n)
            metrics["critic/baseline_score/mean"] = float(baseline.mean())
        return batch, metrics

    def _old_log_probs_for_live_rows_only(self, columns: dict[str, bool], correcting: bool) -> bool:
        """Whether the old log-probs are read by the policy's update alone, which leaves the rows whose advantages
        are all 0 out: then they are computed after the advantages, for the other rows only. Not where anything
        else reads them (rollout correction, a KL penalty in the reward, the estimator, distillation metrics) or
        rows are resampled after the advantages (PF-PPO)."""
        return (columns["old_log_probs"] and columns.get("zero_advantage_rows_left_out", False) and not correcting
                and self.kl_in_reward is None and self.pf_ppo is None and not self.estimator_needs.old_log_probs
                and not self.estimator_needs.token_statistics and not self.estimator_needs.teacher_log_probs)

    def _old_log_probs_of_live_rows(self, batch: Batch) -> Batch:
        """`old_log_probs` (B, R) of the rows with a nonzero advantage, 0 elsewhere (never read: the update
        leaves those rows out, and a 0 there keeps any ratio finite)."""
        live = ~zero_advantage_rows(batch["advantages"], batch["response_mask"])
        old = torch.zeros(batch["responses"].shape, dtype=torch.float32)
        if bool(live.any()):
            rows = live.nonzero().squeeze(-1)
            old[rows] = self.policy.compute_log_probs(batch.index(rows))["old_log_probs"].to(old.dtype)
        return Batch({"old_log_probs": old})

    def _advantage_inputs(self, batch: Batch) -> AdvantageInputs:
        column = lambda key: batch[key] if key in batch else None  # noqa: E731
        return AdvantageInputs(
            token_level_rewards=batch["token_level_rewards"],
            response_mask=batch["response_mask"],
            group_ids=group_ids_from_uids(batch["uid"]),
            values=column("values"),
            baseline_rewards=column("baseline_rewards"),
            old_log_probs=column("old_log_probs"),
            sum_pi_squared=column("sum_pi_squared"),
            rollout_is_weights=column("rollout_is_weights"),
            teacher_log_probs=column("teacher_log_probs"),
        )

    def _correct_rollout(self, batch: Batch) -> dict[str, float]:
        """Rollout correction in place: old log-probs (bypass), the mask after rejection, IS weights
        for the policy loss; its diagnostics under verl's `rollout_corr/` names."""
        out = self.rollout_correction(
            batch["old_log_probs"] if "old_log_probs" in batch else None, batch["rollout_log_probs"],
            batch["response_mask"],
        )
        batch["old_log_probs"] = out.old_log_probs
        batch["response_mask"] = out.response_mask
        if out.rollout_is_weights is not None:
            batch["rollout_is_weights"] = out.rollout_is_weights
        return {f"rollout_corr/{k}": float(v) for k, v in out.metrics.items()}

    def _pf_ppo_resample(self, batch: Batch, step: int) -> tuple[Batch, dict[str, float]]:
        """PF-PPO: rows drawn with replacement by the weighting of their scores (after the advantages,
        as verl does, so group baselines see the batch as sampled)."""
        scores = batch["token_level_scores"].sum(dim=1)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)  # resumable
        rows = pf_ppo_resample(scores, self.pf_ppo, generator=generator)
        return batch.index(rows), {
            "pf_ppo/score_mean_before": float(scores.mean()),
            "pf_ppo/unique_fraction": float(torch.unique(rows).numel() / len(rows)),
        }

    def _rewards(self, batch: Batch) -> dict[str, float]:
        """token_level_rewards: the scores, minus the KL penalty when it is in the reward."""
        if self.kl_in_reward is None:
            batch["token_level_rewards"] = batch["token_level_scores"]
            return {}
        rewards, kl = apply_kl_penalty(
            batch["token_level_scores"], batch["old_log_probs"], batch["ref_log_probs"], batch["response_mask"],
            coef=self.kl_in_reward.value, estimator=self.kl_estimator,
        )
        batch["token_level_rewards"] = rewards
        mask = batch["response_mask"]
        # the controller tracks the mean per-sequence KL (Ziegler et al.), as verl does
        current = float(((kl * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean())
        coef = self.kl_in_reward.value
        self.kl_in_reward.update(current, len(batch))
        return {"actor/reward_kl_penalty": current, "actor/reward_kl_penalty_coeff": coef}

    def _prompt_texts(self, batch: Batch, rows: list[int]) -> list[str]:
        """The prompts of `rows`, decoded (without their left padding)."""
        ids = batch["prompts"][rows].tolist()
        real = batch["attention_mask"][rows, : batch["prompts"].shape[1]].bool().tolist()
        return self.tokenizer.batch_decode([[t for t, r in zip(row, m) if r] for row, m in zip(ids, real)],
                                           skip_special_tokens=False)

    # -------------------------------------------------------- checkpoints
    def save(self, checkpoints: CheckpointManager, step: int, ctx: StageContext) -> Path:
        groups = [("policy", self.policy)] + ([("critic", self.critic)] if self.critic is not None else [])
        for name, group in groups:
            if not all(group.weights_finite()):
                raise NonFiniteTrainingError(
                    f"the {name} weights are not finite at step {step}; refusing to write a checkpoint. "
                    f"Resume from {checkpoints.latest() or 'the start'} with a lower learning rate."
                )

        with self._rollouts.checkpoint(step) as rollouts:  # async: the producer pauses, its queue is kept
            def write_parts(folder: Path) -> None:
                for name, group in groups:
                    group.save_state(str(folder / name))
                rollouts.write(folder)

            state = {
                "kl_in_reward": self.kl_in_reward.state_dict() if self.kl_in_reward is not None else None,
                "metrics": self._metrics,  # what the stage reports if it resumes here at its last step
                "heldout": self.heldout.state_dict() if self.heldout is not None else None,
                "time_budget": self.budget.state_dict(),
                **rollouts.state,  # data_position (streaming datasets); async_rollout: its queue's state
            }
            return checkpoints.save(step, write_parts, state)

    def restore(self, checkpoints: CheckpointManager, ctx: StageContext) -> int:
        """Load the newest intact checkpoint, if any (broken ones are set aside with a warning and
        recorded in the run as `resume.skipped`); returns the step to continue after."""

        def load(folder: Path) -> None:
            self.policy.load_state(str(folder / "policy"))
            if self.critic is not None:
                self.critic.load_state(str(folder / "critic"))

        folder, state, skipped = checkpoints.resume(load)
        if folder is not None or skipped:
            ctx.record({"resume": {"from": str(folder), "skipped": skipped}})
        if self.kl_in_reward is not None and state.get("kl_in_reward") is not None:
            self.kl_in_reward.load_state_dict(state["kl_in_reward"])
        self._data_position = state.get("data_position")
        self._resumed_rollout = (state.get("async_rollout"), folder) if folder is not None else None
        self._metrics = dict(state.get("metrics") or {})
        self.budget.load_state_dict(state.get("time_budget") or {})
        if self.heldout is not None:
            self.heldout.load_state_dict(state.get("heldout") or {})
            best = json.loads((ctx.out_dir / BEST_FILE).read_text()) if (ctx.out_dir / BEST_FILE).is_file() else {}
            if best.pop("metric", None) == self.heldout.metric:  # best/ may be newer than the checkpoint: it was evaluated
                self.heldout.best = BestHeldout(**best)
        truncate_records(ctx.out_dir, state["step"])
        return int(state["step"])
