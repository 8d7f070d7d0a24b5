"""`draw`'s two-level CDF inversion: the token one whole-row inversion picks, and never an impossible one."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf.rollout.decode import DRAW_BLOCK, draw


def whole_row_inversion(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The reference: one cumulative sum over each row, in float64."""
    cdf = probs.double().cumsum(dim=-1)
    u = uniform.double() * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=probs.shape[1] - 1)


def test_two_levels_pick_the_whole_rows_token():
    """Random peaked rows over a vocabulary that is not a multiple of the block: the tokens agree with a float64
    inversion except where a uniform number falls within float32 rounding of a boundary, where the neighbour is
    drawn (2 of 20,000 here, as many as a float32 cumulative sum over the whole row gives)."""
    g = torch.Generator().manual_seed(0)
    vocab = 3 * DRAW_BLOCK + 517
    probs = torch.softmax(torch.randn(20_000, vocab, generator=g) * 4, dim=-1)
    uniform = torch.rand(20_000, 1, generator=g)
    drawn, reference = draw(probs, uniform), whole_row_inversion(probs, uniform)
    differ = drawn != reference
    assert differ.sum() <= 5
    assert ((drawn - reference)[differ].abs() == 1).all()


def test_small_vocabularies_take_one_partial_block():
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]]).expand(5, 4)
    uniform = torch.tensor([[0.0], [0.099], [0.1001], [0.61], [0.9999]])
    assert draw(probs, uniform).tolist() == [0, 0, 1, 3, 3]


@settings(max_examples=60, deadline=None)
@given(vocab=st.integers(1, 3 * DRAW_BLOCK + 5), seed=st.integers(0, 2**16), zero_share=st.floats(0.0, 0.999),
       zero_blocks=st.lists(st.integers(0, 3), max_size=3), uniform=st.sampled_from([0.0, 0.5, 1 - 2**-24, None]))
def test_an_impossible_token_is_never_drawn(vocab, seed, zero_share, zero_blocks, uniform):
    """Zero probabilities anywhere (whole blocks, the last entries), unnormalised rows, and uniform numbers at the
    edges of [0, 1): the drawn token always has a positive probability."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.rand(8, vocab, generator=g) * 3
    probs[torch.rand(8, vocab, generator=g) < zero_share] = 0.0
    for block in zero_blocks:
        probs[:, block * DRAW_BLOCK : (block + 1) * DRAW_BLOCK] = 0.0
    probs[:, -1] = 0.0 if vocab > 1 else 1.0
    probs[probs.sum(dim=1) == 0, 0] = 1.0  # every row can draw something
    u = torch.rand(8, 1, generator=g) if uniform is None else torch.full((8, 1), uniform)
    tokens = draw(probs, u)
    assert (probs.gather(1, tokens[:, None]) > 0).all()
