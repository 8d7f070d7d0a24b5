"""rlhf.algos.distillation: the OPD advantage, its mix with a task estimator, top-k forward KL, metrics.

Hand-computed values, then properties: a student equal to its teacher gets zero advantage, zero loss and zero
gradient; the gradient moves the student toward the teacher on every token (sign tests); the expected policy
gradient of the OPD advantage is exactly minus the gradient of the reverse KL.
"""

import math

import pytest
import torch
from hypothesis import given, strategies as st

from rlhf.algos import GAE, GRPO, AdvantageInputs, PPOClipLoss, REINFORCELoss
from rlhf.algos.distillation import (
    OnPolicyDistillation,
    TopKForwardKL,
    distillation_metrics,
    reverse_kl_advantages,
    top_k_overlap,
)
from rlhf.algos.requirements import estimator_needs, setup_problems, teacher_problems

from .strategies import cases, perturb_padding

LN2 = math.log(2.0)


def inputs(student, teacher, mask, **kw):
    return AdvantageInputs(token_level_rewards=torch.zeros_like(student), response_mask=mask,
                           old_log_probs=student, teacher_log_probs=teacher, **kw)


# ---------------------------------------------------------------- hand-computed
def test_reverse_kl_advantage_by_hand():
    # student p = [1/2, 1/4, 1/8], teacher q = [1/4, 1/2, 1/8]: A = ln q - ln p = [-ln 2, ln 2, 0]; the last
    # position is padding -> 0
    student = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.125), -3.0]])
    teacher = torch.tensor([[math.log(0.25), math.log(0.5), math.log(0.125), -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    expected = torch.tensor([[-LN2, LN2, 0.0, 0.0]])
    torch.testing.assert_close(reverse_kl_advantages(student, teacher, mask), expected)
    adv, returns = OnPolicyDistillation(distill_coef=0.5)(inputs(student, teacher, mask))
    torch.testing.assert_close(adv, 0.5 * expected)
    torch.testing.assert_close(returns, adv)


def test_the_mix_adds_the_task_advantage():
    # two samples of one prompt, scores 1 and 0 on their last token: GRPO gives +-(0.5 / std) with
    # std = sqrt(((0.5)^2 * 2) / 1) = 0.70711 -> +-0.70711 on every valid token
    student = torch.log(torch.tensor([[0.5, 0.5], [0.25, 0.5]]))
    teacher = torch.log(torch.tensor([[0.25, 0.5], [0.25, 0.25]]))
    mask = torch.ones(2, 2)
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    batch = AdvantageInputs(token_level_rewards=rewards, response_mask=mask, group_ids=torch.tensor([0, 0]),
                            old_log_probs=student, teacher_log_probs=teacher)
    grpo = 0.5 / math.sqrt(0.5)
    # OPD: ln(q/p) = [[-ln 2, 0], [0, -ln 2]], times distill_coef 2
    adv, returns = OnPolicyDistillation(distill_coef=2.0, task=GRPO(eps=0.0))(batch)
    expected = torch.tensor([[-2 * LN2 + grpo, grpo], [-grpo, -2 * LN2 - grpo]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(returns, torch.tensor([[grpo, grpo], [-grpo, -grpo]]))  # the task's own returns


def test_top_k_forward_kl_by_hand():
    # V = 3, k = 2. teacher mu = [0.5, 0.3, 0.2], student pi = [0.2, 0.5, 0.3]; the teacher's top-2 = tokens 0, 1
    mu, pi = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.5, 0.3])
    ids = torch.tensor([0, 1])
    teacher, student = mu[ids].log().view(1, 1, 2), pi[ids].log().view(1, 1, 2)
    mask = torch.ones(1, 1)
    # with the tail bucket it is the full KL here (the tail is one token): .5 ln 2.5 + .3 ln .6 + .2 ln(2/3)
    full = 0.5 * math.log(2.5) + 0.3 * math.log(0.6) + 0.2 * math.log(2 / 3)  # 0.223805
    loss, metrics = TopKForwardKL(k=2, coef=3.0)(student, teacher, mask)
    assert metrics["top_k_forward_kl"].item() == pytest.approx(full, abs=1e-6)
    assert loss.item() == pytest.approx(3 * full, abs=1e-6)
    # renormalised over the two tokens: mu~ = [5/8, 3/8], pi~ = [2/7, 5/7]:
    # 5/8 ln(35/16) + 3/8 ln(21/40) = 0.489135 - 0.241624 = 0.247511
    renorm = 5 / 8 * math.log((5 / 8) / (2 / 7)) + 3 / 8 * math.log((3 / 8) / (5 / 7))
    _, metrics = TopKForwardKL(k=2, tail=False)(student, teacher, mask)
    assert metrics["top_k_forward_kl"].item() == pytest.approx(renorm, abs=1e-6)


def test_metrics_and_overlap_by_hand():
    student = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    teacher = torch.log(torch.tensor([[0.25, 0.5, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    m = distillation_metrics(student, teacher, mask)
    assert m["reverse_kl"] == pytest.approx(0.0)  # (ln 2 - ln 2) / 2
    # k3 = r - 1 - ln r, r = q/p = [1/2, 2]: (-1/2 + ln 2) + (1 - ln 2) = 1/2, mean 0.25
    assert m["reverse_kl_k3"] == pytest.approx(0.25)
    assert m["teacher_log_prob"] == pytest.approx((math.log(0.25) + math.log(0.5)) / 2)
    # teacher's top-2 {3, 7} vs the student's {7, 1}: 1 of 2; {1, 2} vs {1, 2}: 2 of 2; padding ignored
    s = torch.tensor([[[7, 1], [2, 1], [0, 0]]])
    t = torch.tensor([[[3, 7], [1, 2], [5, 6]]])
    assert top_k_overlap(s, t, mask).item() == pytest.approx(0.75)


# ---------------------------------------------------------------- properties
@given(cases(), st.floats(0.1, 4.0))
def test_a_student_equal_to_its_teacher_gets_zero_advantage_and_gradient(case, coef):
    student = case.randn(scale=3.0).clamp(max=0.0) - 0.01
    teacher = perturb_padding(student.clone(), case.mask, case.gen)  # equal where it counts
    adv, _ = OnPolicyDistillation(distill_coef=coef)(inputs(student, teacher, case.mask))
    assert torch.count_nonzero(adv) == 0
    log_probs = student.clone().requires_grad_(True)
    loss, _ = PPOClipLoss()(log_probs, student, adv, case.mask)
    loss.backward()
    assert torch.count_nonzero(log_probs.grad) == 0


@given(cases(empty_rows=False))
def test_the_gradient_moves_every_sampled_token_toward_the_teacher(case):
    """On-policy (ratio 1), -dL/d log pi(y_t) has the sign of log mu(y_t) - log pi(y_t) on every valid token:
    a gradient step raises the tokens the teacher prefers and lowers the others."""
    student = case.randn(scale=2.0).clamp(max=0.0) - 0.01
    teacher = case.randn(scale=2.0).clamp(max=0.0) - 0.01
    adv, _ = OnPolicyDistillation()(inputs(student, teacher, case.mask))
    for loss_fn in (PPOClipLoss(), REINFORCELoss()):
        log_probs = student.clone().requires_grad_(True)
        loss_fn(log_probs, student, adv, case.mask)[0].backward()
        valid = case.mask.bool()
        assert torch.equal(torch.sign(-log_probs.grad)[valid], torch.sign(teacher - student)[valid])
        assert torch.count_nonzero(log_probs.grad[~valid]) == 0


@given(st.integers(2, 12), st.integers(0, 2**31 - 1), st.floats(0.3, 2.0))
def test_the_expected_update_is_minus_the_reverse_kl_gradient(vocab, seed, temperature):
    """E_{y~pi}[A(y) grad log pi(y)] = -grad_z KL(pi || mu) exactly, pi = softmax(z / tau), mu the teacher's
    softmax at the same tau: the OPD advantage under a policy-gradient loss descends the reverse KL."""
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(vocab, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    teacher = torch.log_softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * 2 / temperature, -1)
    log_pi = torch.log_softmax(z / temperature, -1)
    every_token = torch.ones(1, vocab, dtype=torch.float64)
    adv = reverse_kl_advantages(log_pi.detach().view(1, -1), teacher.view(1, -1), every_token).view(-1)
    (surrogate,) = torch.autograd.grad((log_pi.exp().detach() * adv * log_pi).sum(), z, retain_graph=True)
    kl = (log_pi.exp() * (log_pi - teacher)).sum()
    (kl_grad,) = torch.autograd.grad(kl, z)
    torch.testing.assert_close(surrogate, -kl_grad)


def bucket_probs(log_probs_k, tail):
    p = log_probs_k.exp()
    return torch.cat([p, 1 - p.sum(-1, keepdim=True)], -1) if tail else p / p.sum(-1, keepdim=True)


@given(st.integers(3, 20), st.integers(1, 5), st.booleans(), st.integers(0, 2**31 - 1), st.booleans())
def test_top_k_forward_kl_zero_at_the_teacher_and_moves_toward_it(vocab, k, tail, seed, equal):
    k = max(min(k, vocab - 1), 1 if tail else 2)
    g = torch.Generator().manual_seed(seed)
    teacher_logits = torch.randn(vocab, generator=g, dtype=torch.float64) * 2
    student_logits = teacher_logits.clone() if equal else torch.randn(vocab, generator=g, dtype=torch.float64) * 2
    z = student_logits.requires_grad_(True)
    ids = teacher_logits.topk(k).indices
    teacher = torch.log_softmax(teacher_logits, -1)[ids].view(1, 1, k)
    student = torch.log_softmax(z, -1)[ids].view(1, 1, k)
    loss, _ = TopKForwardKL(k=k, tail=tail)(student, teacher, torch.ones(1, 1, dtype=torch.float64))
    (grad,) = torch.autograd.grad(loss, z)
    if equal:
        assert abs(loss.item()) < 1e-12 and grad.abs().max().item() < 1e-12
        return
    assert loss.item() >= -1e-12 and grad.abs().max().item() > 0  # never a term without gradient (miles#2362)
    # dL/dz_v = pi_b(v) - mu_b(v) for v in the teacher's top-k (bucket probabilities)
    expected = (bucket_probs(student.detach(), tail) - bucket_probs(teacher, tail)).view(-1)[:k]
    torch.testing.assert_close(grad[ids], expected)
    moved = torch.sign(-grad[ids]) == torch.sign(bucket_probs(teacher, tail).view(-1)[:k]
                                                 - bucket_probs(student.detach(), tail).view(-1)[:k])
    assert moved.all()


@given(cases())
def test_top_k_loss_ignores_padding(case):
    k = 3
    student = torch.log_softmax(case.randn(case.B, case.T, 8, scale=1.0), -1)[..., :k].requires_grad_(True)
    teacher = torch.log_softmax(case.randn(case.B, case.T, 8, scale=1.0), -1)[..., :k]
    padded = torch.where(case.mask.bool()[..., None], teacher, torch.zeros_like(teacher))  # restore_order's zeros
    loss, _ = TopKForwardKL(k=k)(student, padded, case.mask)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(student.grad).all()
    assert torch.count_nonzero(student.grad[~case.mask.bool()]) == 0


def test_a_top_k_term_that_could_never_have_a_gradient_is_refused():
    with pytest.raises(ValueError, match="no gradient"):
        TopKForwardKL(k=1, tail=False)
    TopKForwardKL(k=1, tail=True)  # the top token against the rest: a real KL


# ---------------------------------------------------------------- needs
def test_needs_follow_the_task():
    assert estimator_needs(OnPolicyDistillation).teacher_log_probs
    pure = estimator_needs(OnPolicyDistillation())
    assert pure.teacher_log_probs and pure.old_log_probs and pure.min_samples == 1
    mixed = estimator_needs(OnPolicyDistillation(task=GRPO()))
    assert mixed.min_samples == 2 and mixed.teacher_log_probs
    assert [p.field for p in setup_problems(OnPolicyDistillation(task=GRPO()), n=1, has_critic=False)] == ["sampling.n"]
    assert setup_problems(OnPolicyDistillation(), n=1, has_critic=False) == []
    assert estimator_needs(OnPolicyDistillation(task=GAE())).critic
    assert [p.field for p in teacher_problems(OnPolicyDistillation(), has_teacher=False)] == \
        ["policy.worker.teacher_model_path"]
    assert teacher_problems(OnPolicyDistillation(), has_teacher=True) == []
    assert teacher_problems(GRPO(), has_teacher=False) == []
