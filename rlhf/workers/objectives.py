"""Training objectives of the actor: what `PolicyWorker.update` minimises on a micro-batch.

An objective receives the trainer's per-token log-probs (B,T) and entropy (B,T) of the
response tokens, the micro-batch, and the GLOBAL token/sequence counts of the mini-batch
(over all data-parallel ranks and micro-batches), so that summing the micro-batch losses
over ranks reproduces the full-batch loss exactly (see rlhf.algos.aggregation).
Metrics are returned as 0-d device tensors: the trainer brings them to the host once per
update, not once per micro-batch (each `float(tensor)` on a GPU is a host sync).
"""

from __future__ import annotations

import torch

from rlhf.algos import DecoupledPPO, KLLoss, PolicyLoss, PPOClipLoss, TopKForwardKL, token_mean, zero_advantage_rows
from rlhf.algos.preference import DPOLoss, PairLogProbs, PreferenceLoss, preference_metrics
from rlhf.batch import Batch


def _detached(value: torch.Tensor | float) -> torch.Tensor | float:
    return value.detach() if isinstance(value, torch.Tensor) else value


class PolicyObjective:
    """PPO-family actor loss: policy-gradient loss + optional KL-to-reference loss + optional top-k forward KL
    to a teacher (on-policy distillation, docs/distillation.md) - entropy bonus."""

    def __init__(
        self,
        policy_loss: PolicyLoss = PPOClipLoss(),  # a policy-gradient loss from rlhf.algos (Frozen: safe to share)
        kl_loss: KLLoss | None = None,  # KL to the reference policy as a loss term (GRPO); None: off
        entropy_coef: float = 0.0,  # weight of the entropy bonus (subtracted from the loss)
        # AReaL's decoupled objective for samples from an older policy (asynchronous rollout, docs/async.md):
        # the loss is weighted by pi_old / pi_rollout per token; None: off
        decoupled: DecoupledPPO | None = None,
        # forward KL to the policy worker's teacher over its top-k tokens at each sampled position (GKD-style);
        # the worker computes both sides from full logits on the sampled sequence; None: off
        distill_loss: TopKForwardKL | None = None,
        # leave rows whose advantages are all 0 out of the update's forward and backward where they add nothing to
        # the loss or its gradient (`skips_inert_rows`); False: every row runs (e.g. `actor/entropy` over all rows)
        skip_inert_rows: bool = True,
    ):
        self.policy_loss = policy_loss
        self.kl_loss = kl_loss
        self.entropy_coef = entropy_coef
        self.decoupled = decoupled
        self.distill_loss = distill_loss
        self.skip_inert_rows = skip_inert_rows

    @property
    def skips_inert_rows(self) -> bool:
        """Whether the update leaves out rows whose advantages are all 0. Exact: such a row's policy loss and its
        gradient are 0 when the loss is row-wise in the advantage (`PolicyLoss.zero_advantage_rows_inert`) and no
        KL, distillation or entropy term reads the row; the losses divide by the global token and sequence
        counts of the whole mini-batch, left-out rows included, so the loss and the step are unchanged.
        GRPO gives every row of a group whose samples scored alike a 0 advantage: on a task the model rarely
        (or nearly always) solves, most of the batch."""
        return (self.skip_inert_rows and self.kl_loss is None and self.distill_loss is None
                and self.entropy_coef == 0.0 and self.policy_loss.zero_advantage_rows_inert)

    def inert_rows(self, batch: Batch) -> torch.Tensor:
        """(B,) bool: the rows whose advantages are 0 at every response token (see `skips_inert_rows`)."""
        return zero_advantage_rows(batch["advantages"], batch["response_mask"])

    @property
    def needs_ref(self) -> bool:
        return self.kl_loss is not None

    @property
    def needs_entropy_grad(self) -> bool:
        return self.entropy_coef != 0.0

    def __call__(
        self, log_probs: torch.Tensor, entropy: torch.Tensor | None, batch: Batch, *, num_tokens: float,
        num_seqs: float,
        top_k_log_probs: torch.Tensor | None = None,  # (B,T,K) student log-probs of the teacher's top-k, with grad
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask = batch["response_mask"]
        # On-policy (one epoch, one mini-batch): old log-probs equal the current ones.
        old = batch["old_log_probs"] if "old_log_probs" in batch else log_probs.detach()
        weights = batch["rollout_is_weights"] if "rollout_is_weights" in batch else None  # rollout correction (TIS)
        behaviour = {}
        if self.decoupled is not None:  # old is pi_prox; the samples came from pi_rollout
            if weights is not None:
                raise ValueError("PolicyObjective.decoupled and RLTrainer.rollout_correction's IS weights both correct "
                                 "for the behaviour policy; keep one of them")
            weights, behaviour = self.decoupled(old, batch["rollout_log_probs"], mask)
        # the generation limit, set once in SamplingParams and recorded by the rollout engine
        counts = dict(num_tokens=num_tokens, num_seqs=num_seqs,
                      max_new_tokens=batch.require_meta("max_new_tokens", "PolicyObjective"))
        loss, raw = self.policy_loss(log_probs, old, batch["advantages"], mask, rollout_is_weights=weights, **counts)
        metrics = {f"actor/{k}": _detached(v) for k, v in {**raw, **behaviour}.items()}
        if self.kl_loss is not None:
            kl, kl_raw = self.kl_loss(log_probs, batch["ref_log_probs"], mask, **counts)
            loss = loss + kl
            metrics.update({f"actor/{k}": _detached(v) for k, v in kl_raw.items()})
        if self.distill_loss is not None:
            if top_k_log_probs is None:
                raise ValueError("PolicyObjective.distill_loss needs the student's log-probs of the teacher's top-k "
                                 "tokens (top_k_log_probs); the policy worker passes them when it has a teacher")
            distill, distill_raw = self.distill_loss(top_k_log_probs, batch["teacher_top_k_log_probs"], mask, **counts)
            loss = loss + distill
            metrics.update({f"distill/{k}": _detached(v) for k, v in distill_raw.items()})
        if entropy is not None and self.entropy_coef:
            loss = loss - self.entropy_coef * token_mean(entropy, mask, num_tokens=num_tokens)
        return loss, metrics


class SFTObjective:
    """Negative log-likelihood of the response tokens only (prompt tokens carry no loss)."""

    needs_ref = False
    needs_entropy_grad = False

    def __call__(
        self, log_probs: torch.Tensor, entropy: torch.Tensor | None, batch: Batch, *, num_tokens: float, num_seqs: float
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask = batch["response_mask"]
        loss = token_mean(-log_probs, mask, num_tokens=num_tokens)
        local = (-log_probs.detach() * mask).sum() / mask.sum().clamp(min=1)
        return loss, {"sft/loss": local}


class DPOObjective:
    """A DPO-family loss (rlhf.algos.preference) over preference pairs: chosen at row 2i, rejected at 2i+1.

    Each row's log-prob is summed over its response tokens; the per-pair losses are summed and divided by
    the GLOBAL pair count (num_seqs / 2), so micro-batch losses over all ranks add up to the batch mean.
    The reference comes per row as `ref_logps` (B,) (cached by the DPO trainer), else per token as
    `ref_log_probs` (B,T), which the policy worker computes itself when the batch lacks both (`needs_ref`:
    a frozen reference model, or the LoRA base with the adapter disabled). `whole_units` tells the worker
    to keep each pair (its rows share a `uid`) in one micro-batch. Metrics are TRL's names, averaged over
    pairs (weighted by each micro-batch's pairs).
    """

    needs_entropy_grad = False
    whole_units = True

    def __init__(self, loss: PreferenceLoss = DPOLoss()):  # a loss of rlhf.algos.preference (Frozen: safe to share)
        self.loss = loss

    @property
    def needs_ref(self) -> bool:
        return self.loss.requires_reference

    def sequence_log_probs(self, log_probs: torch.Tensor, batch: Batch) -> PairLogProbs:
        """Per-pair inputs of the loss from per-token log-probs (B,T) and the batch's columns."""
        if "uid" in batch.non_tensors:
            uid = batch.non_tensors["uid"]
            if len(uid) % 2 or any(uid[i] != uid[i + 1] for i in range(0, len(uid) - 1, 2)):
                raise ValueError("DPOObjective: a micro-batch holds a split preference pair (rows 2i and 2i+1 must "
                                 "share a uid); the policy worker keeps pairs whole (`whole_units`), and a data-"
                                 "parallel step needs a number of pairs that divides by the number of workers")
        mask = batch["response_mask"].to(log_probs.dtype)
        ref = None
        if self.needs_ref:
            if "ref_logps" in batch:
                ref = batch["ref_logps"].to(log_probs.dtype)
            elif "ref_log_probs" in batch:
                ref = (batch["ref_log_probs"].to(log_probs.dtype) * mask).sum(dim=1)
            else:
                raise KeyError(f"{type(self.loss).__name__} needs reference log-probs: the batch has neither "
                               "`ref_logps` (B,) nor `ref_log_probs` (B,T)")
        margin = batch["margin"].to(log_probs.dtype) if "margin" in batch else None
        return PairLogProbs.from_rows((log_probs * mask).sum(dim=1), mask.sum(dim=1), ref, margin)

    def __call__(
        self, log_probs: torch.Tensor, entropy: torch.Tensor | None, batch: Batch, *, num_tokens: float, num_seqs: float
    ) -> tuple[torch.Tensor, dict]:
        pairs = self.sequence_log_probs(log_probs, batch)
        out = self.loss(pairs)
        loss = out.losses.sum() / (num_seqs / 2)
        count = float(len(out.losses))
        metrics = {("dpo/loss" if k == "loss" else k): (v, count) for k, v in preference_metrics(pairs, out).items()}
        return loss, metrics
