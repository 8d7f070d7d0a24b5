"""rlhf.algos.logprobs: against log_softmax, gradients, chunking, low precision."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.algos.logprobs import (
    block_rows,
    entropy_from_logits,
    entropy_from_logits_chunked,
    linear_log_probs_and_entropy,
    log_probs_and_entropy,
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


@settings(max_examples=25)
@given(st.integers(1, 40), st.integers(2, 9), st.sampled_from([0.3, 1.0, 2.5]), st.integers(0, 2**31 - 1))
def test_joint_log_probs_and_entropy_with_temperature_match_autograd(N, V, tau, seed):
    # both outputs in one loss: the joint backward must equal autograd through log_softmax(z / tau)
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(N, 1, V, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    labels = torch.randint(0, V, (N, 1), generator=g)
    u_lp, u_h = torch.randn(N, 1, generator=g, dtype=torch.float64), torch.randn(N, 1, generator=g, dtype=torch.float64)
    lp, h = log_probs_and_entropy(logits, labels, temperature=tau, with_entropy=True, max_block_elements=2 * V)
    grad = torch.autograd.grad((lp * u_lp + h * u_h).sum(), logits)[0]
    z = logits / tau
    ref_lp = torch.log_softmax(z, -1).gather(-1, labels[..., None]).squeeze(-1)
    ref_h = entropy_from_logits(z)
    ref_grad = torch.autograd.grad((ref_lp * u_lp + ref_h * u_h).sum(), logits, retain_graph=True)[0]
    torch.testing.assert_close(lp, ref_lp)
    torch.testing.assert_close(h, ref_h)
    torch.testing.assert_close(grad, ref_grad)
    # the entropy detached (a metric) leaves the log-prob gradient unchanged
    lp2, h2 = log_probs_and_entropy(logits, labels, temperature=tau, with_entropy=True)
    grad2 = torch.autograd.grad((lp2 * u_lp).sum() + 0 * h2.detach().sum(), logits)[0]
    ref_grad2 = torch.autograd.grad((ref_lp * u_lp).sum(), logits)[0]
    torch.testing.assert_close(grad2, ref_grad2)


@given(st.integers(1, 10**6), st.integers(1, 200_000), st.integers(1, 2**26))
def test_block_rows_bounds_memory_and_launches(rows, vocab, budget):
    r = block_rows(rows, vocab, budget)
    assert 1 <= r <= max(1, -(-rows // 4))  # never a block as large as the input (beyond 4 rows)
    assert r * vocab <= budget or r == 1  # within the memory budget unless one row exceeds it
    blocks = -(-rows // r)
    # launches: a constant 4 until the budget binds, then proportional to the bytes moved
    assert blocks <= max(4, 2 * -(-rows * vocab // budget) + 1)


def test_bf16_logits_are_never_copied_whole_to_float32():
    # 4096 tokens x 1000 vocabulary in bf16: the largest float32 tensor allocated must be a block
    from torch.utils._python_dispatch import TorchDispatchMode

    class LargestFloat32(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                    LargestFloat32.largest = max(LargestFloat32.largest, t.numel())
            return out

    logits = torch.randn(8, 512, 1000).to(torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, 1000, (8, 512))
    with LargestFloat32():
        lp, h = log_probs_and_entropy(logits, labels, temperature=0.7, with_entropy=True)
        (lp.sum() + h.sum()).backward()
    assert LargestFloat32.largest <= logits.numel() // 4


@settings(max_examples=30)
@given(st.integers(1, 30), st.integers(2, 6), st.integers(2, 11), st.sampled_from([0.5, 1.0]), st.booleans(),
       st.booleans(), st.integers(0, 2**31 - 1))
def test_fused_linear_path_equals_logits_then_log_probs(N, H, V, tau, with_entropy, keep_logits, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, 1, H, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, V, (N, 1), generator=g)
    u = torch.randn(N, 1, generator=g, dtype=torch.float64)
    lp, h = linear_log_probs_and_entropy(hidden, weight, labels, temperature=tau, with_entropy=with_entropy,
                                         max_block_elements=3 * V, keep_logits=keep_logits)
    loss = (lp * u).sum() + (h * u * 0.3).sum() if with_entropy else (lp * u).sum()
    grads = torch.autograd.grad(loss, (hidden, weight))
    lp_ref, h_ref = log_probs_and_entropy(hidden @ weight.T, labels, temperature=tau, with_entropy=with_entropy)
    loss_ref = (lp_ref * u).sum() + (h_ref * u * 0.3).sum() if with_entropy else (lp_ref * u).sum()
    grads_ref = torch.autograd.grad(loss_ref, (hidden, weight))
    assert lp.dtype == torch.float32  # statistics in float32 (the reference keeps float64)
    torch.testing.assert_close(lp, lp_ref.float(), atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, grads_ref):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_kept_logits_give_the_recomputed_path_s_numbers(tau):
    """float32, as on a CPU: keeping the logits changes where they come from, not the arithmetic (the
    products run once over all rows instead of per block, which a BLAS may round differently)."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 7, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, requires_grad=True)
    labels = torch.randint(0, 50, (3, 7), generator=g)
    u = torch.randn(3, 7, generator=g)
    out = {}
    for keep in (False, True):
        lp, h = linear_log_probs_and_entropy(hidden, weight, labels, temperature=tau, with_entropy=True,
                                             max_block_elements=4 * 50, keep_logits=keep)
        out[keep] = (lp, h, *torch.autograd.grad((lp * u).sum() + (h * u).sum(), (hidden, weight)))
    for got, want in zip(out[True], out[False]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_kept_logits_are_the_only_logits_sized_tensor():
    """Keeping: one (N, V) float32 tensor (the logits, then their gradient) and block temporaries."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class LogitsSized(TorchDispatchMode):
        storages: set[int] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.numel() >= 64 * 4096:
                    LogitsSized.storages.add(t.untyped_storage().data_ptr())
            return out

    hidden = torch.randn(64, 32, requires_grad=True)
    weight = torch.randn(4096, 32, requires_grad=True)
    labels = torch.randint(0, 4096, (64,))
    for keep, expected in ((True, 1), (False, 0)):  # recomputing keeps none
        LogitsSized.storages = set()
        with LogitsSized():
            lp, h = linear_log_probs_and_entropy(hidden, weight, labels, with_entropy=True, keep_logits=keep,
                                                 max_block_elements=16 * 4096)
            (lp.sum() + h.sum()).backward()
        assert len(LogitsSized.storages) == expected


def test_sum_pi_squared_in_blocks_at_a_temperature():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g, dtype=torch.float64)
    expected = torch.softmax(logits / 0.7, dim=-1).square().sum(-1)
    for budget in (11, 33, None):  # one row per block, three, the default
        out = sum_pi_squared_from_logits(logits, temperature=0.7, max_block_elements=budget)
        torch.testing.assert_close(out, expected)
    bf16 = sum_pi_squared_from_logits(logits.to(torch.bfloat16), temperature=0.7, max_block_elements=11)
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, expected.float(), atol=2e-2, rtol=2e-2)


@settings(max_examples=25)
@given(
    st.integers(1, 3), st.integers(1, 5), st.integers(2, 9), st.integers(1, 4), st.integers(1, 200),
    st.sampled_from([0.5, 1.0, 1.7]), st.integers(0, 2**31 - 1),
)
def test_log_probs_at_matches_log_softmax_value_and_grad(B, T, V, K, budget, temperature, seed):
    """The K-token gather (a teacher's top-k under the student) against log_softmax(z / tau).gather, in value and
    gradient, with repeated ids and block budgets down to one row."""
    from rlhf.algos.logprobs import log_probs_at, top_k_log_probs

    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, T, V, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    ids = torch.randint(0, V, (B, T, K), generator=g)
    upstream = torch.randn(B, T, K, generator=g, dtype=torch.float64)
    lp = log_probs_at(logits, ids, temperature=temperature, max_block_elements=budget)
    (grad,) = torch.autograd.grad((lp * upstream).sum(), logits)
    ref = torch.log_softmax(logits / temperature, -1).gather(-1, ids)
    (ref_grad,) = torch.autograd.grad((ref * upstream).sum(), logits)
    torch.testing.assert_close(lp, ref)
    torch.testing.assert_close(grad, ref_grad)
    k = min(K, V)
    top_ids, top_lp = top_k_log_probs(logits, k, temperature=temperature)
    torch.testing.assert_close(top_lp, torch.log_softmax(logits.detach() / temperature, -1).topk(k).values)
    assert not top_lp.requires_grad


def test_log_probs_at_by_hand():
    # logits [0, ln 3] at temperature 1: p = [1/4, 3/4];
    # at temperature 2: z/2 = [0, ln 3 / 2], p = [1, sqrt 3] / (1 + sqrt 3)
    from rlhf.algos.logprobs import log_probs_at

    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    ids = torch.tensor([[[1, 0]]])
    torch.testing.assert_close(log_probs_at(logits, ids), torch.tensor([[[math.log(0.75), math.log(0.25)]]]))
    s3 = math.sqrt(3.0)
    torch.testing.assert_close(log_probs_at(logits, ids, temperature=2.0),
                               torch.tensor([[[math.log(s3 / (1 + s3)), math.log(1 / (1 + s3))]]]))
