"""rlhf.algos.value_loss: hand-computed clipped value loss and its clip fraction."""

import pytest
import torch
from hypothesis import given, settings

from rlhf.algos.aggregation import seq_mean_token_sum
from rlhf.algos.value_loss import ClippedValueLoss

from .strategies import cases, perturb_padding


def test_golden():
    values = torch.tensor([[1.0, 0.0, 2.0, 9.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.0, 1.0, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, m = ClippedValueLoss(clip_range=0.2)(values, old, returns, mask)
    # token 0: v 1.0 -> clipped 0.7; (1-2)^2 = 1 vs (0.7-2)^2 = 1.69 -> clipped term 1.69
    # token 1: v = old = 0; (0-1)^2 = 1 both -> 1
    # token 2: v 2.0 -> clipped 1.2; (2-1)^2 = 1 vs (1.2-1)^2 = 0.04 -> unclipped 1
    # loss = 0.5 * (1.69 + 1 + 1) / 3 = 0.615
    assert loss.item() == pytest.approx(0.615)
    assert m["vf_loss"].item() == pytest.approx(0.615)
    assert m["vf_clipfrac"].item() == pytest.approx(1 / 3)
    loss.backward()
    # d/dv of 0.5 (v - R)^2 / 3: token 0 clipped -> 0; token 1 -> (0 - 1) / 3; token 2 -> (2 - 1) / 3
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -1 / 3, 1 / 3, 0.0]]))


def test_no_clip_and_other_aggregation():
    values = torch.tensor([[1.0, 3.0]])
    returns = torch.tensor([[0.0, 0.0]])
    loss, m = ClippedValueLoss(clip_range=None, aggregate=seq_mean_token_sum)(values, values, returns, torch.ones(1, 2))
    assert loss.item() == pytest.approx(5.0)  # 0.5 * (1 + 9) summed over one sequence
    assert m["vf_clipfrac"].item() == 0.0


@settings(max_examples=30)
@given(cases())
def test_padding_and_clip_properties(case):
    v = case.randn().requires_grad_(True)
    old, ret = case.randn(), case.randn()
    loss_obj = ClippedValueLoss(clip_range=0.2)
    a, ma = loss_obj(v, old, ret, case.mask)
    (g,) = torch.autograd.grad(a, v)
    vn = perturb_padding(v.detach(), case.mask, case.gen).requires_grad_(True)
    b, mb = loss_obj(vn, perturb_padding(old, case.mask, case.gen), ret, case.mask)
    (gn,) = torch.autograd.grad(b, vn)
    assert torch.isfinite(a) and a >= 0
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(g, gn)
    torch.testing.assert_close(ma["vf_clipfrac"], mb["vf_clipfrac"])
    # where the clipped term wins, the gradient is zero
    outside = (v.detach() - old).abs() > 0.2
    v_clip = old + (v.detach() - old).clamp(-0.2, 0.2)
    clipped = outside & ((v_clip - ret).square() > (v.detach() - ret).square())
    assert (g[clipped] == 0).all()
