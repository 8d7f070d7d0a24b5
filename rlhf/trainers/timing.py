"""Wall-clock timing of the phases of a step, reported as verl's `timing_s/<phase>` metrics."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


@contextlib.contextmanager
def timed(into: dict[str, float], phase: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        into[f"timing_s/{phase}"] = into.get(f"timing_s/{phase}", 0.0) + time.perf_counter() - start
