"""rlhf.algos.scan: the chunked reverse discounted sum against a per-step loop."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.algos.scan import Packing, is_prefix_mask, masked_reverse_discounted_cumsum, reverse_discounted_cumsum

from .strategies import masks


def loop_reference(x, mask, d):
    """y_t = x_t + d * y_{next valid}, masked positions skipped (the carried value passes through)."""
    B, T = x.shape
    y = torch.zeros_like(x)
    carry = torch.zeros(B, dtype=x.dtype)
    for t in reversed(range(T)):
        valid = mask[:, t] != 0
        carry = torch.where(valid, x[:, t] + d * carry, carry)
        y[:, t] = torch.where(valid, carry, torch.zeros_like(carry))
    return y


def test_golden():
    # y = [1 + .5*2 + .25*3, 2 + .5*3, 3] = [2.75, 3.5, 3]
    x = torch.tensor([[1.0, 2.0, 3.0]])
    torch.testing.assert_close(reverse_discounted_cumsum(x, 0.5, chunk_size=2), torch.tensor([[2.75, 3.5, 3.0]]))
    # the hole at position 1 is skipped: y0 = 1 + .5*3 = 2.5, y1 = 0, y2 = 3
    m = torch.tensor([[1.0, 0.0, 1.0]])
    torch.testing.assert_close(masked_reverse_discounted_cumsum(x, m, 0.5), torch.tensor([[2.5, 0.0, 3.0]]))


@settings(max_examples=40)
@given(
    st.integers(1, 4), st.integers(1, 150), st.integers(1, 70),
    st.sampled_from([0.0, 0.3, 0.9, 0.99, 1.0]), st.integers(0, 2**31 - 1),
)
def test_dense_matches_loop(B, T, chunk, d, seed):
    x = torch.randn(B, T, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    ones = torch.ones(B, T, dtype=torch.float64)
    torch.testing.assert_close(reverse_discounted_cumsum(x, d, chunk_size=chunk), loop_reference(x, ones, d))


@settings(max_examples=100)
@given(masks(max_b=5, max_t=40), st.sampled_from([0.0, 0.5, 0.95, 1.0]), st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_masked_matches_loop(mask, d, chunk, seed):
    x = torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    torch.testing.assert_close(masked_reverse_discounted_cumsum(x, mask, d, chunk_size=chunk), loop_reference(x, mask, d))


@settings(max_examples=40)
@given(masks(max_b=5, max_t=20))
def test_packing_round_trip_and_prefix_detection(mask):
    lengths = mask.sum(-1).long()
    expected_prefix = bool((mask == (torch.arange(mask.shape[1]) < lengths[:, None])).all())
    assert is_prefix_mask(mask) == expected_prefix
    x = torch.randn(mask.shape, dtype=torch.float64)
    p = Packing(mask, torch.float64)
    packed = p.pack(x)
    for i in range(mask.shape[0]):
        n = int(lengths[i])
        torch.testing.assert_close(packed[i, :n], x[i][mask[i] != 0])
        assert (packed[i, n:] == 0).all()
    torch.testing.assert_close(p.unpack(packed), x * mask)


def test_bad_discount():
    import pytest

    with pytest.raises(ValueError):
        reverse_discounted_cumsum(torch.ones(1, 3), 1.5)
