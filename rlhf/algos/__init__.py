"""rlhf.algos: the algorithm math of RL post-training, as pure functions and small classes
over tensors (no I/O, no models, no torch.distributed, no fiddle).

Notation everywhere: B batch (responses), T response tokens, V vocabulary, G a group of
responses to one prompt. Masks are (B, T), nonzero = a token that counts. Formulas,
papers and the graph node that selects each piece are in docs/algorithms.md.
"""

from rlhf.algos.advantages import (
    GAE,
    GPG,
    GRPO,
    OPO,
    RLOO,
    AdvantageInputs,
    GRPOPassK,
    OptimalTokenBaseline,
    ReinforcePlusPlus,
    ReinforcePlusPlusBaseline,
    ReMax,
)
from rlhf.algos.aggregation import (
    Aggregation,
    count_seqs,
    count_tokens,
    seq_mean_token_mean,
    seq_mean_token_sum,
    seq_mean_token_sum_norm,
    token_mean,
)
from rlhf.algos.dapo import DynamicSamplingAccumulator, groups_with_variance, overlong_penalty
from rlhf.algos.distillation import (
    OnPolicyDistillation,
    TopKForwardKL,
    distillation_metrics,
    reverse_kl_advantages,
    top_k_overlap,
)
from rlhf.algos.groups import Groups, group_by, group_ids_from_uids
from rlhf.algos.kl import (
    AdaptiveKLController,
    FixedKLController,
    KLLoss,
    StraightThrough,
    apply_kl_penalty,
    kl_abs,
    kl_k1,
    kl_k2,
    kl_k3,
)
from rlhf.algos.logprobs import (
    entropy_from_logits,
    entropy_from_logits_chunked,
    linear_log_probs_and_entropy,
    log_probs_and_entropy,
    log_probs_at,
    log_probs_from_logits,
    sum_pi_squared_from_logits,
    top_k_log_probs,
)
from rlhf.algos.masked import masked_max, masked_mean, masked_sum, masked_var, masked_whiten, masked_zero
from rlhf.algos.pairs import split_pairs
from rlhf.algos.pf_ppo import MaxMinWeights, MaxRandomWeights, PowWeights, pf_ppo_resample
from rlhf.algos.policy_loss import (
    CISPOLoss,
    ClipCovLoss,
    GMPOLoss,
    GPGLoss,
    GSPOLoss,
    KLCovLoss,
    PolicyLoss,
    PPOClipLoss,
    REINFORCELoss,
    SAPOLoss,
    zero_advantage_rows,
)
from rlhf.algos.rollout_correction import (
    RejectionMask,
    RolloutCorrection,
    RolloutCorrectionOutput,
    SequenceTIS,
    DecoupledPPO,
    TokenTIS,
    effective_sample_size,
    mismatch_metrics,
    reduce_seq_max,
    reduce_seq_mean,
    reduce_seq_sum,
    reduce_token,
)
from rlhf.algos.scan import masked_reverse_discounted_cumsum, reverse_discounted_cumsum
from rlhf.algos.preference import (
    DPOLoss,
    IPOLoss,
    PairLogProbs,
    PairLoss,
    PreferenceLoss,
    RobustDPOLoss,
    RPOLoss,
    SimPOLoss,
    preference_metrics,
)
from rlhf.algos.reward_model_loss import BradleyTerryLoss
from rlhf.algos.value_loss import ClippedValueLoss

__all__ = [
    # masked reductions
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "masked_max",
    "masked_zero",
    # log-probs and entropy
    "log_probs_from_logits",
    "log_probs_and_entropy",
    "linear_log_probs_and_entropy",
    "entropy_from_logits",
    "entropy_from_logits_chunked",
    "sum_pi_squared_from_logits",
    "log_probs_at",
    "top_k_log_probs",
    # aggregation
    "Aggregation",
    "token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_mean",
    "seq_mean_token_sum_norm",
    "count_tokens",
    "count_seqs",
    # policy losses
    "PolicyLoss",
    "PPOClipLoss",
    "zero_advantage_rows",
    "GSPOLoss",
    "SAPOLoss",
    "GPGLoss",
    "ClipCovLoss",
    "KLCovLoss",
    "GMPOLoss",
    "CISPOLoss",
    "REINFORCELoss",
    # value loss
    "ClippedValueLoss",
    # preference pairs: reward-model loss
    "split_pairs",
    "BradleyTerryLoss",
    # preference pairs: the DPO family
    "PairLogProbs",
    "PairLoss",
    "PreferenceLoss",
    "DPOLoss",
    "RobustDPOLoss",
    "IPOLoss",
    "SimPOLoss",
    "RPOLoss",
    "preference_metrics",
    # KL
    "kl_k1",
    "kl_abs",
    "kl_k2",
    "kl_k3",
    "StraightThrough",
    "KLLoss",
    "apply_kl_penalty",
    "FixedKLController",
    "AdaptiveKLController",
    # advantages
    "AdvantageInputs",
    "GAE",
    "GRPO",
    "GRPOPassK",
    "RLOO",
    "OPO",
    "GPG",
    "ReinforcePlusPlus",
    "ReinforcePlusPlusBaseline",
    "ReMax",
    "OptimalTokenBaseline",
    # on-policy distillation
    "OnPolicyDistillation",
    "TopKForwardKL",
    "reverse_kl_advantages",
    "top_k_overlap",
    "distillation_metrics",
    # groups and scans
    "Groups",
    "group_by",
    "group_ids_from_uids",
    "reverse_discounted_cumsum",
    "masked_reverse_discounted_cumsum",
    # rollout correction
    "TokenTIS",
    "SequenceTIS",
    "RejectionMask",
    "reduce_token",
    "reduce_seq_sum",
    "reduce_seq_mean",
    "reduce_seq_max",
    "RolloutCorrection",
    "RolloutCorrectionOutput",
    "DecoupledPPO",
    "mismatch_metrics",
    "effective_sample_size",
    # DAPO, PF-PPO
    "overlong_penalty",
    "groups_with_variance",
    "DynamicSamplingAccumulator",
    "PowWeights",
    "MaxMinWeights",
    "MaxRandomWeights",
    "pf_ppo_resample",
]
