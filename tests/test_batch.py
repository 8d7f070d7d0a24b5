"""Batch: the row algebra every component relies on."""

import pickle

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlhf.batch import Batch, pad_rows


def make(n: int, width: int = 3) -> Batch:
    return Batch(
        {"x": torch.arange(n * width).reshape(n, width), "y": torch.arange(n, dtype=torch.float32)},
        {"uid": [f"u{i}" for i in range(n)]},
        {"temperature": 0.7},
    )


@given(n=st.integers(1, 30), k=st.integers(1, 8))
def test_pad_chunk_concat_unpad_roundtrip(n, k):
    b = make(n)
    padded, pad = b.pad_to_multiple(k)
    assert len(padded) % k == 0 and 0 <= pad < k
    back = Batch.concat(padded.chunk(k)).unpad(pad)
    assert torch.equal(back["x"], b["x"]) and list(back["uid"]) == list(b["uid"])
    assert back.meta == b.meta


@given(n=st.integers(1, 10), r=st.integers(1, 4))
def test_repeat_interleave_keeps_groups_adjacent(n, r):
    b = make(n).repeat(r, interleave=True)
    assert list(b["uid"]) == [f"u{i}" for i in range(n) for _ in range(r)]
    t = make(n).repeat(r, interleave=False)
    assert list(t["uid"]) == [f"u{i}" for _ in range(r) for i in range(n)]


def test_index_by_mask_list_and_slice():
    b = make(5)
    assert list(b.index(torch.tensor([True, False, True, False, False]))["uid"]) == ["u0", "u2"]
    assert list(b.index([4, 0])["uid"]) == ["u4", "u0"]
    assert torch.equal(b.index(slice(1, 3))["y"], torch.tensor([1.0, 2.0]))


def test_union_select_pop():
    b = make(4)
    extra = Batch({"z": torch.ones(4)})
    u = b.union(extra)
    assert set(u.keys()) == {"x", "y", "z", "uid"}
    with pytest.raises(ValueError, match="differs"):
        b.union(Batch({"y": torch.zeros(4)}))
    popped = u.pop(["z"])
    assert "z" not in u and torch.equal(popped["z"], torch.ones(4))
    with pytest.raises(KeyError, match="no column"):
        u.select(["nope"])


def test_mismatched_rows_rejected():
    with pytest.raises(ValueError, match="disagree"):
        Batch({"a": torch.zeros(3)}, {"b": ["x", "y"]})
    b = make(3)
    with pytest.raises(ValueError, match="rows"):
        b["w"] = torch.zeros(2)


def test_concat_right_pads_ragged_widths():
    a = Batch({"responses": torch.ones(2, 3, dtype=torch.long)})
    c = Batch({"responses": torch.ones(1, 5, dtype=torch.long)})
    out = Batch.concat([a, c])
    assert out["responses"].shape == (3, 5)
    assert out["responses"][:2, 3:].eq(0).all()


def test_split_sizes():
    assert [len(p) for p in make(7).split(3)] == [3, 3, 1]


def test_non_tensor_columns_are_object_arrays():
    b = Batch.from_rows([{"a": {"k": 1}, "b": "s"}, {"a": {"k": 2}, "b": "t"}])
    assert isinstance(b["a"], np.ndarray) and b["a"][1] == {"k": 2}


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_pickle_round_trip_keeps_values_dtypes_and_owns_memory(protocol):
    """Batches cross process boundaries as pickles (numpy buffers, see Batch.__reduce__)."""
    b = Batch(
        {
            "f": torch.randn(4, 3),
            "bf16": torch.randn(4, 2).to(torch.bfloat16),
            "strided": torch.arange(8).view(4, 2)[:, 1],
            "mask": torch.tensor([True, False, True, True]),
            "grad": torch.randn(4, requires_grad=True),
        },
        {"uid": ["a", "b", "c", "d"], "gt": [1, None, {"x": 2}, "4"]},
        {"temperature": 0.7},
    )
    c = pickle.loads(pickle.dumps(b, protocol=protocol))
    assert c.keys() == b.keys() and c.meta == b.meta
    for k, v in b.tensors.items():
        assert c[k].dtype == v.dtype and torch.equal(c[k], v.detach()), k
    assert list(c["gt"]) == list(b["gt"])
    c["f"][0, 0] = 123.0
    assert b["f"][0, 0] != 123.0
    assert not c["grad"].requires_grad


@pytest.mark.parametrize("rows, side, min_width, expected", [
    ([[1, 2, 3], [4]], "left", 0, [[1, 2, 3], [9, 9, 4]]),
    ([[1, 2, 3], [4]], "right", 0, [[1, 2, 3], [4, 9, 9]]),
    ([[], [5, 6]], "left", 0, [[9, 9], [5, 6]]),  # an empty row is all padding
    ([[], [5, 6]], "right", 0, [[9, 9], [5, 6]]),
    ([[7]], "left", 3, [[9, 9, 7]]),  # at least min_width columns
    ([[7]], "right", 3, [[7, 9, 9]]),
    ([[], []], "right", 1, [[9], [9]]),  # agents' batches keep one column
    ([(1, 2), range(3, 4)], "right", 0, [[1, 2], [3, 9]]),  # any sequence of ints
    ([np.array([1, 2]), np.array([3])], "left", 0, [[1, 2], [9, 3]]),
])
def test_pad_rows_table(rows, side, min_width, expected):
    out = pad_rows(rows, 9, side, min_width=min_width)
    assert out.dtype == torch.long and out.tolist() == expected


def test_pad_rows_keeps_floats_and_takes_no_rows():
    out = pad_rows([[0.5], [0.25, -1.0]], 0.0, "right", torch.float32)
    assert out.dtype == torch.float32 and out.tolist() == [[0.5, 0.0], [0.25, -1.0]]
    assert pad_rows([], 0, "left", min_width=1).shape == (0, 1)
