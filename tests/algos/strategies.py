"""Hypothesis strategies shared by the algos tests.

Hypothesis draws the structure (shapes, masks, group layouts, magnitudes, a seed); tensor
values come from a torch.Generator seeded by the drawn seed, so examples are cheap and
reproducible (the test profile is derandomized).
"""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st

MAGNITUDES = [1e-3, 1.0, 30.0, 1e3]


@dataclasses.dataclass
class Case:
    """A drawn batch layout: mask (B, T) float 0/1, a seeded generator, a magnitude."""

    mask: torch.Tensor
    gen: torch.Generator
    scale: float

    @property
    def B(self) -> int:
        return self.mask.shape[0]

    @property
    def T(self) -> int:
        return self.mask.shape[1]

    def randn(self, *shape: int, scale: float | None = None, dtype=torch.float64) -> torch.Tensor:
        s = self.scale if scale is None else scale
        return torch.randn(*(shape or (self.B, self.T)), generator=self.gen, dtype=dtype) * s

    def rand(self, *shape: int, dtype=torch.float64) -> torch.Tensor:
        return torch.rand(*(shape or (self.B, self.T)), generator=self.gen, dtype=dtype)


@st.composite
def masks(draw, min_b: int = 1, max_b: int = 6, min_t: int = 1, max_t: int = 10, holes: bool = True, empty_rows: bool = True):
    """(B, T) float64 0/1 masks: ragged right padding, optional all-zero rows, single-token
    rows, and (holes=True) mask-0 positions inside a response."""
    B = draw(st.integers(min_b, max_b))
    T = draw(st.integers(min_t, max_t))
    lo = 0 if empty_rows else 1
    lengths = draw(st.lists(st.integers(lo, T), min_size=B, max_size=B))
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).to(torch.float64)
    if holes and draw(st.booleans()):
        flat = draw(st.lists(st.booleans(), min_size=B * T, max_size=B * T))
        hole = torch.tensor(flat).view(B, T)
        # keep the first token of each non-empty row so rows stay non-empty
        hole[:, 0] = False
        mask = mask * (~hole)
    return mask


@st.composite
def cases(draw, **mask_kwargs):
    mask = draw(masks(**mask_kwargs))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.sampled_from(MAGNITUDES))
    return Case(mask, torch.Generator().manual_seed(seed), scale)


@st.composite
def group_ids(draw, B: int):
    """(B,) int64 group ids: arbitrary values (large, negative), unsorted, any group sizes."""
    n_groups = draw(st.integers(1, B))
    labels = draw(st.lists(st.integers(-(2**40), 2**40), min_size=n_groups, max_size=n_groups, unique=True))
    assignment = draw(st.lists(st.integers(0, n_groups - 1), min_size=B, max_size=B))
    return torch.tensor([labels[a] for a in assignment], dtype=torch.int64)


@st.composite
def grouped_cases(draw, min_b: int = 2, max_b: int = 8, max_t: int = 8, **mask_kwargs):
    """A Case plus group ids; rows have >= 1 valid token unless empty_rows=True is passed."""
    mask_kwargs.setdefault("empty_rows", False)
    case = draw(cases(min_b=min_b, max_b=max_b, max_t=max_t, **mask_kwargs))
    return case, draw(group_ids(case.B))


def outcome_rewards(case: Case, scores: torch.Tensor) -> torch.Tensor:
    """(B, T) token rewards with each score on the row's last valid token (0 elsewhere)."""
    T = case.T
    last = (case.mask * torch.arange(1, T + 1, dtype=case.mask.dtype)).argmax(-1)
    r = torch.zeros(case.B, T, dtype=torch.float64)
    r[torch.arange(case.B), last] = scores.to(torch.float64)
    return r * case.mask


def perturb_padding(x: torch.Tensor, mask: torch.Tensor, gen: torch.Generator, big: float = 1e6) -> torch.Tensor:
    """x with every masked position replaced by large random finite values."""
    noise = torch.randn(x.shape, generator=gen, dtype=x.dtype) * big
    return torch.where(mask != 0, x, noise)
