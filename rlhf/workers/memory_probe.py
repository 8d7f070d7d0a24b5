"""Measured peak memory of a block of code: live tensor bytes, the quantity the memory planner predicts.

On a GPU it is the caching allocator's own count (`torch.cuda.max_memory_allocated`, bytes in
live tensors, not the cache reserved around them). A CPU has no such count, so there a
`TorchDispatchMode` tracks storages: every storage alive when the block starts (found among the
live tensors) and every storage an operation creates inside it is registered with a weak
reference whose callback subtracts its bytes when it is freed; `UntypedStorage.resize_` (FSDP2
frees and re-allocates gathered parameters that way) updates its size. The peak is the most
bytes alive at once. Tensors made outside torch's dispatcher inside the block (a file mapped by
safetensors) are not seen; model weights loaded before the block are.
"""

from __future__ import annotations

import gc
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["PeakMemory", "live_storages"]


def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    """A plain tensor's storage (None for tensor subclasses such as DTensor: their local tensors count)."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.device.type == "meta":
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse or otherwise storage-less tensors
        return None


def live_storages(device: str = "cpu") -> list[torch.UntypedStorage]:
    """Every distinct storage of a live plain tensor on `device` type (a walk over the garbage collector's objects)."""
    seen: dict[int, torch.UntypedStorage] = {}
    with warnings.catch_warnings():  # isinstance on some objects (deprecated torch aliases) warns
        warnings.simplefilter("ignore")
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in tensors:
        st = _storage(obj)
        if st is not None and st.device.type == device and st.nbytes() > 0:
            seen.setdefault(st.data_ptr(), st)
    return list(seen.values())


def live_bytes(device: str = "cpu") -> int:
    """Bytes of every live tensor storage on `device` type now (after a garbage collection)."""
    gc.collect()
    return sum(st.nbytes() for st in live_storages(device))


class _StorageTracker(TorchDispatchMode):
    """Live bytes of the storages it knows, and their peak. A storage is keyed by its Python object, which
    torch keeps the same while the storage lives."""

    def __init__(self, device: str):
        super().__init__()
        self.device = device
        self.refs: dict[int, tuple[weakref.ref, int]] = {}  # id(storage) -> (weak reference, bytes)
        self.live = 0
        self.peak = 0

    def register(self, st: torch.UntypedStorage) -> None:
        known = self.refs.get(id(st))
        if known is not None and known[0]() is st:
            return
        key = id(st)
        self.refs[key] = (weakref.ref(st, lambda ref, key=key: self._freed(key, ref)), st.nbytes())
        self.live += st.nbytes()
        self.peak = max(self.peak, self.live)

    def _freed(self, key: int, ref: weakref.ref) -> None:
        known = self.refs.get(key)
        if known is not None and known[0] is ref:
            self.live -= known[1]
            del self.refs[key]

    def resized(self, st: torch.UntypedStorage) -> None:
        known = self.refs.get(id(st))
        if known is None or known[0]() is not st:
            self.register(st)
            return
        self.live += st.nbytes() - known[1]
        self.refs[id(st)] = (known[0], st.nbytes())
        self.peak = max(self.peak, self.live)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = _storage(t)
                if st is not None and st.device.type == self.device:
                    self.register(st)
        return out


class PeakMemory:
    """`with PeakMemory(device) as m: ...`, then `m.peak` (bytes) and `m.start` (bytes alive when it began)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.start = 0
        self.peak = 0

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
            return self
        gc.collect()
        self._tracker = _StorageTracker(self.device.type)
        for st in live_storages(self.device.type):
            self._tracker.register(st)
        self.start = self._tracker.live
        self._tracker.peak = self._tracker.live
        self._resize = _patched_resize(self._tracker)
        self._resize.__enter__()
        self._tracker.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device)
            return
        self._tracker.__exit__(*exc)
        self._resize.__exit__(*exc)
        self.peak = self._tracker.peak
        del self._tracker


@contextmanager
def _patched_resize(tracker: _StorageTracker) -> Iterator[None]:
    original = torch.UntypedStorage.resize_

    def resize_(st: torch.UntypedStorage, size: int):
        out = original(st, size)
        tracker.resized(st)
        return out

    torch.UntypedStorage.resize_ = resize_
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original
