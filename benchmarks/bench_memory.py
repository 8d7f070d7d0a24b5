"""Host memory of one process, phase by phase: RSS and the allocator's live bytes, sampled in a thread.

`PhaseMemory` samples the resident set size (/proc/self/statm) and glibc's live heap bytes
(`mallinfo2`: bytes handed out by malloc, from the heap and from mmap) every `interval` seconds,
and charges each sample to the phase the process is in (`phase("generate")`, nested phases
joined by "/"). The difference between the two is memory the allocator holds for reuse after
tensors were freed (or that was never malloc'd: code, file mappings). torch's CPU tensors are
malloc'd (posix_memalign), so live bytes are tensor bytes plus Python's own small objects.

`saved_activation_bytes` counts the distinct storages autograd keeps for backward in a block
(parameters excluded): the activations one micro-batch holds at the end of its forward.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator

import torch

_PAGE = os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _mallinfo2():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        return libc.mallinfo2
    except (OSError, AttributeError):  # not glibc >= 2.33
        return None


_MALLINFO2 = _mallinfo2()


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def live_heap_bytes() -> int | None:
    """Bytes malloc has handed out and not had back (heap + mmapped chunks); None off glibc."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return info.uordblks + info.hblkhd


class PhaseMemory:
    """Per phase: the highest RSS and live heap bytes seen, and both at the phase's last sample."""

    def __init__(self, interval: float = 0.02):
        self.interval = interval
        self.current = "start"
        self.phases: dict[str, dict[str, float]] = {}
        self.peak_rss = 0
        self.peak_live = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> PhaseMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        outer = self.current
        self.sample()
        self.current = name if outer in ("start", "idle") else f"{outer}/{name}"
        try:
            yield
        finally:
            self.sample()
            self.current = outer if outer != "start" else "idle"

    def sample(self) -> None:
        rss, live = rss_bytes(), live_heap_bytes() or 0
        stats = self.phases.setdefault(self.current, {"peak_rss": 0, "peak_live": 0})
        stats["peak_rss"] = max(stats["peak_rss"], rss)
        stats["peak_live"] = max(stats["peak_live"], live)
        stats["rss"], stats["live"] = rss, live
        self.peak_rss, self.peak_live = max(self.peak_rss, rss), max(self.peak_live, live)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def report(self) -> dict:
        gib = 2**30
        return {
            "peak_rss_gib": round(self.peak_rss / gib, 3),
            "peak_live_gib": round(self.peak_live / gib, 3),
            "phases": {name: {k: round(v / gib, 3) for k, v in stats.items()} for name, stats in self.phases.items()},
        }


@contextlib.contextmanager
def saved_activation_bytes(exclude: list[torch.Tensor]) -> Iterator[dict[str, int]]:
    """Within the block, counts the bytes of distinct storages saved for backward, except `exclude`'s
    (the parameters): `out["bytes"]`, and `out["largest"]` for the largest single storage."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}
    out = {"bytes": 0, "largest": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in skip and ptr not in seen and storage.nbytes():
            seen[ptr] = storage.nbytes()
            out["bytes"] += storage.nbytes()
            out["largest"] = max(out["largest"], storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield out


def tensor_bytes(tensors) -> int:
    """Bytes of distinct storages among `tensors`."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if t is not None}
    return sum(storages.values())
