"""rlhf.algos.groups: vectorised group statistics against a per-group loop."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import numpy as np

from rlhf.algos.groups import group_by, group_ids_from_uids

from .strategies import group_ids


def test_golden():
    ids = torch.tensor([7, -3, 7, 100, 7])
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    g = group_by(ids)  # sorted distinct ids: -3, 7, 100
    assert g.size.tolist() == [1, 3, 1]
    assert g.mean(x).tolist() == [2.0, 3.0, 4.0]  # group 7: (1 + 3 + 5) / 3
    assert g.std(x).tolist() == [0.0, 2.0, 0.0]  # group 7: sqrt(((1-3)^2 + 0 + (5-3)^2) / 2) = 2
    assert g.amax(x).tolist() == [2.0, 5.0, 4.0]
    assert g.broadcast(g.amin(x)).tolist() == [1.0, 2.0, 1.0, 4.0, 1.0]


@settings(max_examples=40)
@given(st.integers(1, 12).flatmap(group_ids))
def test_matches_loop(ids):
    x = torch.randn(ids.shape[0], dtype=torch.float64)
    g = group_by(ids)
    for k, gid in enumerate(torch.unique(ids)):
        sel = x[ids == gid]
        assert g.size[k] == sel.numel()
        torch.testing.assert_close(g.sum(x)[k], sel.sum())
        torch.testing.assert_close(g.mean(x)[k], sel.mean())
        torch.testing.assert_close(g.std(x)[k], sel.std() if sel.numel() > 1 else torch.tensor(0.0, dtype=x.dtype))
        assert g.amax(x)[k] == sel.max() and g.amin(x)[k] == sel.min()
    assert g.broadcast(g.size).tolist() == [int((ids == i).sum()) for i in ids]


def test_group_ids_from_uids():
    uids = np.array(["b7", "a1", "b7", "zz", "a1"], dtype=object)
    ids = group_ids_from_uids(uids)
    assert ids.dtype == torch.int64
    assert ids.tolist() == [1, 0, 1, 2, 0]  # sorted distinct uids: a1, b7, zz
    assert group_ids_from_uids(["x"]).tolist() == [0]
