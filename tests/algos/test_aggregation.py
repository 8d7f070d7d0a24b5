"""rlhf.algos.aggregation: hand-computed values, and the sharding invariant (value and gradient)."""

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.algos.aggregation import (
    count_seqs,
    count_tokens,
    seq_mean_token_mean,
    seq_mean_token_sum,
    seq_mean_token_sum_norm,
    token_mean,
)

from .strategies import cases, perturb_padding

ALL = [token_mean, seq_mean_token_sum, seq_mean_token_mean, seq_mean_token_sum_norm,
       functools.partial(seq_mean_token_sum_norm, max_new_tokens=7)]

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
# valid rows: [1, 2] (sum 3, mean 1.5) and [4] (sum 4, mean 4); the third row is empty.


def test_counts():
    assert count_tokens(MASK).item() == 3
    assert count_seqs(MASK).item() == 2  # the empty row does not count


def test_golden_values():
    assert token_mean(LOSS, MASK).item() == pytest.approx(7 / 3)  # (1 + 2 + 4) / 3
    assert seq_mean_token_sum(LOSS, MASK).item() == pytest.approx(3.5)  # (3 + 4) / 2
    assert seq_mean_token_mean(LOSS, MASK).item() == pytest.approx(2.75)  # (1.5 + 4) / 2
    assert seq_mean_token_sum_norm(LOSS, MASK, max_new_tokens=4).item() == pytest.approx(0.875)  # (3 + 4) / 2 / 4
    assert seq_mean_token_sum_norm(LOSS, MASK).item() == pytest.approx(7 / 6)  # L_max defaults to T = 3
    # global counts override the local ones: (1 + 2 + 4) / 7 and (3 + 4) / 5
    assert token_mean(LOSS, MASK, num_tokens=7).item() == pytest.approx(1.0)
    assert seq_mean_token_sum(LOSS, MASK, num_seqs=5).item() == pytest.approx(1.4)
    assert seq_mean_token_mean(LOSS, MASK, num_seqs=5).item() == pytest.approx(1.1)  # 5.5 / 5


@pytest.mark.parametrize("agg", ALL)
def test_empty_mask_gives_zero(agg):
    out = agg(LOSS, torch.zeros_like(MASK))
    assert out.item() == 0.0
    assert agg(LOSS, torch.zeros_like(MASK), num_tokens=0, num_seqs=0).item() == 0.0


def test_norm_rejects_bad_length():
    with pytest.raises(ValueError, match="max_new_tokens must be positive"):
        seq_mean_token_sum_norm(LOSS, MASK, max_new_tokens=0)


@pytest.mark.parametrize("agg", [token_mean, seq_mean_token_sum, seq_mean_token_mean])
def test_only_the_norm_reads_the_generation_limit(agg):
    assert agg(LOSS, MASK, max_new_tokens=4).item() == agg(LOSS, MASK).item()


@settings(max_examples=100)
@given(cases(max_b=8), st.data())
def test_sharding_reproduces_full_batch_value_and_gradient(case, data):
    """Split rows into data-parallel shards, each into micro-batches; with the global counts
    the parts sum to the full-batch loss, and so do the gradients."""
    n_shards = data.draw(st.integers(1, case.B))
    shard_of = torch.tensor(data.draw(st.lists(st.integers(0, n_shards - 1), min_size=case.B, max_size=case.B)))
    micro = data.draw(st.integers(1, case.B))
    loss_mat = case.randn().requires_grad_(True)
    n_tok, n_seq = count_tokens(case.mask), count_seqs(case.mask)
    for agg in ALL:
        full = agg(loss_mat, case.mask)
        (g_full,) = torch.autograd.grad(full, loss_mat)
        total = torch.zeros((), dtype=loss_mat.dtype)
        for s in range(n_shards):
            rows = (shard_of == s).nonzero().squeeze(-1)
            for mb in rows.split(micro):
                total = total + agg(loss_mat[mb], case.mask[mb], num_tokens=n_tok, num_seqs=n_seq)
        (g_parts,) = torch.autograd.grad(total, loss_mat)
        torch.testing.assert_close(total, full)
        torch.testing.assert_close(g_parts, g_full)


@settings(max_examples=40)
@given(cases())
def test_padding_never_leaks(case):
    loss_mat = case.randn().requires_grad_(True)
    noisy = perturb_padding(loss_mat.detach(), case.mask, case.gen).requires_grad_(True)
    for agg in ALL:
        a, b = agg(loss_mat, case.mask), agg(noisy, case.mask)
        assert torch.isfinite(a)
        torch.testing.assert_close(a, b)
        (ga,) = torch.autograd.grad(a, loss_mat)
        (gb,) = torch.autograd.grad(b, noisy)
        torch.testing.assert_close(ga, gb)
        assert (gb[case.mask == 0] == 0).all()
