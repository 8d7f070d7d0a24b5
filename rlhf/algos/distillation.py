"""On-policy distillation (OPD): a frozen teacher scores every token the student samples.

Notation: B batch (responses), T response tokens, K tokens per position of a top-k set, V vocabulary.
pi = the student (the policy being trained), mu = the teacher; both are the softmax of the logits divided by
the sampling temperature tau (`SamplingParams.logit_temperature`), the distribution the tokens were drawn
from. A teacher scored at another temperature trains the student toward another distribution (slime fixed
exactly that: its teacher was scored at temperature 0 while the student sampled at 1).

**Reverse KL as the per-token advantage** (GKD, Agarwal et al. 2024, arXiv:2306.13649; MiniLLM, Gu et al.
2024, arXiv:2306.08543; Thinking Machines, "On-Policy Distillation", 2025; verl's and TRL's OPD):

    A_t = -k1(log pi(y_t), log mu(y_t)) = log mu(y_t) - log pi(y_t)        y_t ~ pi; no baseline, no discount

Under a policy-gradient loss (PPO-clip, REINFORCE) the expected update is E_{y~pi}[A_t grad log pi(y_t)] =
-grad KL(pi_t || mu_t), the reverse KL of the next-token distributions at each sampled prefix (E_pi[grad log pi]
= 0 removes the constant), so the loss descends the reverse KL without any baseline. k1 (`rlhf.algos.kl`) is the
one estimator there whose sign says which way to move: A_t > 0 where the teacher gives the sampled token more
probability than the student does, and the update raises it; k2, k3 and |k1| are >= 0, so as advantages they
would push every sampled token down. Their values still estimate the KL: `distillation_metrics` reports k1
(the mean advantage, negated) and k3 (unbiased, >= 0, lower variance). Discount 0: each token is trained on its
own term only, as Thinking Machines and verl do; a student equal to its teacher gets A = 0 everywhere.

**A mix with a task reward** (`OnPolicyDistillation(task=GRPO())`): A_t = distill_coef * A^OPD_t + A^task_t,
so OPD and GRPO combine in one estimator node.

**Top-k forward KL** (GKD's forward divergence on the student's samples, restricted to the teacher's top-k):
with S_t the teacher's k most probable tokens at position t and "tail" everything else,

    L_t = sum_{v in S_t} mu(v) (log mu(v) - log pi(v)) + mu(tail) (log mu(tail) - log pi(tail))     tail=True
    L_t = sum_{v in S_t} mu~(v) (log mu~(v) - log pi~(v)),  mu~, pi~ renormalised over S_t           tail=False

Both are the KL of two categorical distributions (the k tokens and the tail bucket, or the k tokens alone), so
L_t >= 0 with equality where the student matches the teacher on those buckets, and the gradient with respect
to the student's logit z_v of a token v in S_t is pi_b(v) - mu_b(v) (the bucket probabilities): it raises
exactly the tokens the teacher prefers. The tail form lower-bounds the full forward KL (coarse-graining loses
information); without the tail, mass the student puts outside S_t is not penalised. Both need the student's
log-probs of the K teacher tokens with gradient, so this is a loss term (`PolicyObjective.distill_loss`), not
an advantage: the policy worker computes them from its full logits on the sampled sequence
(`rlhf.algos.logprobs.log_probs_at`), and the teacher's top-k from the teacher's full logits on the same
sequence (our engines return the sampled token's log-prob only).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch
from torch import Tensor

from rlhf.algos.advantages import AdvantageInputs
from rlhf.algos.aggregation import Aggregation, token_mean
from rlhf.algos.frozen import Frozen
from rlhf.algos.kl import kl_k1, kl_k3
from rlhf.algos.masked import as_bool, masked_mean, masked_zero
from rlhf.algos.requirements import EstimatorNeeds, estimator_needs

__all__ = [
    "OnPolicyDistillation", "TopKForwardKL", "distillation_metrics", "reverse_kl_advantages", "top_k_overlap",
]

TAIL_LOG_MASS_MAX = -1e-6
"""log of the mass of the top-k set is clamped below this (the tail keeps >= ~1e-6), so log(tail) stays finite."""


def reverse_kl_advantages(student_log_probs: Tensor, teacher_log_probs: Tensor, response_mask: Tensor) -> Tensor:
    """A_t = -k1(log pi(y_t), log mu(y_t)) = log mu(y_t) - log pi(y_t) at valid tokens, 0 elsewhere, (B, T).

    student_log_probs, teacher_log_probs: (B, T) log-probs of the sampled tokens at the sampling temperature;
    response_mask: (B, T). No gradient (an advantage is a constant of the loss)."""
    with torch.no_grad():
        dtype = torch.promote_types(student_log_probs.dtype, torch.float32)
        return masked_zero(-kl_k1(student_log_probs.to(dtype), teacher_log_probs.to(dtype)), response_mask)


class OnPolicyDistillation(Frozen):
    """The advantage of on-policy distillation, alone or added to a task estimator's (module docstring):

        A_t = distill_coef * (log mu(y_t) - log pi(y_t)) [+ A^task_t]

    distill_coef: weight of the per-token reverse-KL term.
    task: an advantage estimator of the task reward (e.g. GRPO()) whose advantages are added; None: pure OPD.
    Reads `old_log_probs` (the student's log-probs of the sampled tokens: the trainer computes them even when
    the update is on-policy) and `teacher_log_probs` (the policy worker's teacher), both at the sampling
    temperature. returns: the task's (its critic's target, for GAE), else the advantages.
    """

    needs: ClassVar[EstimatorNeeds] = EstimatorNeeds(old_log_probs=True, teacher_log_probs=True)
    requires_critic: ClassVar[bool] = False

    def __init__(self, distill_coef: float = 1.0, task: Any = None):
        self.distill_coef = distill_coef
        self.task = task
        if task is not None:  # the task's needs too (GRPO: two samples per prompt; GAE: a critic)
            self.needs = dataclasses.replace(estimator_needs(task), old_log_probs=True, teacher_log_probs=True)
            self.requires_critic = self.needs.critic

    @torch.no_grad()
    def __call__(self, inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
        for name in ("old_log_probs", "teacher_log_probs"):
            if getattr(inputs, name) is None:
                raise ValueError(f"OnPolicyDistillation needs AdvantageInputs.{name}")
        adv = self.distill_coef * reverse_kl_advantages(inputs.old_log_probs, inputs.teacher_log_probs,
                                                        inputs.response_mask)
        if self.task is None:
            return adv, adv.clone()
        task_adv, task_returns = self.task(inputs)
        return adv + task_adv.to(adv.dtype), task_returns

    def __repr__(self) -> str:
        return f"OnPolicyDistillation(distill_coef={self.distill_coef}, task={self.task!r})"


def _log1mexp(x: Tensor) -> Tensor:
    """log(1 - exp(x)) for x < 0, accurate at both ends (Maechler 2012)."""
    return torch.where(x > -0.6931471805599453, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def _bucket_log_probs(top_k_log_probs: Tensor, tail: bool) -> Tensor:
    """(..., K) log-probs of the top-k tokens -> (..., K+1) with the tail bucket last (tail=True), or (..., K)
    renormalised over the k tokens (tail=False)."""
    mass = torch.logsumexp(top_k_log_probs, dim=-1, keepdim=True)
    if not tail:
        return top_k_log_probs - mass
    return torch.cat([top_k_log_probs, _log1mexp(mass.clamp(max=TAIL_LOG_MASS_MAX))], dim=-1)


class TopKForwardKL(Frozen):
    """Forward KL to the teacher over its top-k tokens at every sampled position, as a loss term (module
    docstring):  loss = coef * aggregate(L, response_mask),  L (B, T) the per-token KL over the buckets.

    k: tokens per position taken from the teacher (the policy worker computes the teacher's top-k from its full
        logits on the sampled sequence). coef: weight of the term. tail: include the bucket of all other tokens
        (True) or renormalise over the k tokens (False). aggregate: see `aggregation`.
    Called (student_log_probs (B,T,K) log pi of the teacher's top-k tokens, with gradient;
    teacher_log_probs (B,T,K) log mu of the same tokens; response_mask (B,T); *, num_tokens, num_seqs,
    max_new_tokens) -> (loss including coef, {"top_k_forward_kl": aggregated L without coef}).
    """

    def __init__(self, k: int = 16, coef: float = 1.0, tail: bool = True, aggregate: Aggregation = token_mean):
        if k < 1 or (k == 1 and not tail):
            raise ValueError(f"TopKForwardKL(k={k}, tail={tail}): renormalised over fewer than two tokens the KL is "
                             "always 0 and gives no gradient; use k >= 2, or tail=True")
        self.k = k
        self.coef = coef
        self.tail = tail
        self.aggregate = aggregate

    def per_token(self, student_log_probs: Tensor, teacher_log_probs: Tensor) -> Tensor:
        """L (B, T): the KL of the teacher's buckets to the student's, >= 0."""
        teacher = _bucket_log_probs(teacher_log_probs.detach().to(student_log_probs.dtype), self.tail)
        student = _bucket_log_probs(student_log_probs, self.tail)
        return (teacher.exp() * (teacher - student)).sum(-1)

    def __call__(
        self, student_log_probs: Tensor, teacher_log_probs: Tensor, response_mask: Tensor, *,
        num_tokens: float | None = None, num_seqs: float | None = None, max_new_tokens: int | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        kl = self.per_token(student_log_probs, teacher_log_probs)
        kl = torch.where(as_bool(response_mask), kl, 0.0)  # padding's made-up top-k must not reach the loss
        value = self.aggregate(kl, response_mask, num_tokens=num_tokens, num_seqs=num_seqs,
                               max_new_tokens=max_new_tokens)
        return self.coef * value, {"top_k_forward_kl": value.detach()}

    def __repr__(self) -> str:
        aggregate = getattr(self.aggregate, "__name__", repr(self.aggregate))
        return f"TopKForwardKL(k={self.k}, coef={self.coef}, tail={self.tail}, aggregate={aggregate})"


def top_k_overlap(student_ids: Tensor, teacher_ids: Tensor, response_mask: Tensor) -> Tensor:
    """Mean over valid tokens of |S_student ∩ S_teacher| / k: how much of the teacher's top-k the student's own
    top-k holds. student_ids, teacher_ids: (B, T, k) token ids; response_mask (B, T). A scalar in [0, 1]."""
    shared = (student_ids.unsqueeze(-1) == teacher_ids.unsqueeze(-2)).any(-1).to(torch.float32).mean(-1)
    return masked_mean(shared, response_mask)


def distillation_metrics(
    student_log_probs: Tensor, teacher_log_probs: Tensor, response_mask: Tensor,
) -> dict[str, float]:
    """Means over the valid tokens of a batch (all (B, T)): `reverse_kl` (k1: log pi - log mu, the OPD advantage
    negated), `reverse_kl_k3` (k3: unbiased, >= 0, lower variance), `teacher_log_prob` (log mu(y_t)) and
    `student_log_prob` (log pi(y_t)). Both estimate KL(pi || mu) per token on the student's own samples."""
    with torch.no_grad():
        student, teacher = student_log_probs.double(), teacher_log_probs.double()
        return {
            "reverse_kl": float(masked_mean(kl_k1(student, teacher), response_mask)),
            "reverse_kl_k3": float(masked_mean(kl_k3(student, teacher), response_mask)),
            "teacher_log_prob": float(masked_mean(teacher, response_mask)),
            "student_log_prob": float(masked_mean(student, response_mask)),
        }
