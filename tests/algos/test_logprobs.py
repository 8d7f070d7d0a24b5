"""rlhf.algos.logprobs: against log_softmax, gradients, chunking, low precision."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.algos.logprobs import (
    entropy_from_logits,
    entropy_from_logits_chunked,
    log_probs_from_logits,
    sum_pi_squared_from_logits,
)


def test_golden_two_tokens():
    # logits [0, ln 3] -> softmax [1/4, 3/4]; log p(label 1) = ln 0.75, log p(label 0) = ln 0.25
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    lp = log_probs_from_logits(logits, torch.tensor([[1, 0]]))
    torch.testing.assert_close(lp, torch.tensor([[math.log(0.75), math.log(0.25)]]))
    # entropy = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.562335
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    torch.testing.assert_close(entropy_from_logits(logits), torch.full((1, 2), h))
    torch.testing.assert_close(entropy_from_logits_chunked(logits, chunk_size=1), torch.full((1, 2), h))
    # sum pi^2 = 1/16 + 9/16 = 10/16
    torch.testing.assert_close(sum_pi_squared_from_logits(logits), torch.full((1, 2), 0.625))


def test_uniform_entropy_is_log_v():
    logits = torch.zeros(2, 3, 7)
    torch.testing.assert_close(entropy_from_logits_chunked(logits, chunk_size=4), torch.full((2, 3), math.log(7)))


@settings(max_examples=25)
@given(
    st.integers(1, 3), st.integers(1, 5), st.integers(2, 9), st.integers(1, 7),
    st.sampled_from([1e-2, 1.0, 50.0]), st.integers(0, 2**31 - 1),
)
def test_matches_log_softmax_value_and_grad(B, T, V, chunk, scale, seed):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=g, dtype=torch.float64) * scale).requires_grad_(True)
    labels = torch.randint(0, V, (B, T), generator=g)
    upstream = torch.randn(B, T, generator=g, dtype=torch.float64)

    lp = log_probs_from_logits(logits, labels, chunk_size=chunk)
    (grad,) = torch.autograd.grad((lp * upstream).sum(), logits)
    ref = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    (ref_grad,) = torch.autograd.grad((ref * upstream).sum(), logits)
    torch.testing.assert_close(lp, ref)
    torch.testing.assert_close(grad, ref_grad)

    h = entropy_from_logits_chunked(logits, chunk_size=chunk)
    (h_grad,) = torch.autograd.grad((h * upstream).sum(), logits)
    h_ref = entropy_from_logits(logits)
    (h_ref_grad,) = torch.autograd.grad((h_ref * upstream).sum(), logits)
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(h_grad, h_ref_grad)
    assert (h >= -1e-9).all() and (h <= math.log(V) + 1e-9).all()


def test_gradcheck():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 5, (2, 3), generator=g)
    assert torch.autograd.gradcheck(lambda z: log_probs_from_logits(z, labels, chunk_size=4), (logits,))
    assert torch.autograd.gradcheck(lambda z: entropy_from_logits_chunked(z, chunk_size=4), (logits,))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_logits_are_computed_in_float32(dtype):
    g = torch.Generator().manual_seed(1)
    logits32 = torch.randn(2, 4, 50, generator=g) * 5
    logits = logits32.to(dtype).requires_grad_(True)
    labels = torch.randint(0, 50, (2, 4), generator=g)
    lp = log_probs_from_logits(logits, labels, chunk_size=3)
    assert lp.dtype == torch.float32
    ref = torch.log_softmax(logits.detach().float(), -1).gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=1e-5)
    lp.sum().backward()
    assert logits.grad.dtype == dtype and torch.isfinite(logits.grad.float()).all()
    h = entropy_from_logits_chunked(logits, chunk_size=3)
    torch.testing.assert_close(h, entropy_from_logits(logits.detach().float()), atol=1e-5, rtol=1e-5)


def test_extreme_logits_stay_finite():
    logits = torch.tensor([[[1e4, -1e4, 0.0], [-3e4, 3e4, 3e4]]], requires_grad=True)
    labels = torch.tensor([[1, 2]])
    lp = log_probs_from_logits(logits, labels)
    h = entropy_from_logits_chunked(logits)
    (lp.sum() + h.sum()).backward()
    # p(label 1) = exp(-2e4): log-prob -2e4 (finite); the second row's two tied maxima give ln(1/2)
    # float32 spacing at 3e4 is ~2e-3, hence the tolerance
    torch.testing.assert_close(lp, torch.tensor([[-2e4, math.log(0.5)]]), atol=5e-3, rtol=0)
    assert torch.isfinite(h).all() and torch.isfinite(logits.grad).all()
