"""`rlhf data prepare TASK --out DIR`: the one `data` action; its flags are `rlhf.data.prepare`'s."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["data_main"]


def data_main(argv: Sequence[str]) -> int:
    """Hand `prepare`'s arguments to `rlhf.data.prepare` (imported then); usage for anything else."""
    if not argv or argv[0] != "prepare":
        print("usage: rlhf data prepare TASK --out DIR   (`rlhf data prepare --help`: the tasks and options)")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    from rlhf.data.prepare import main as prepare

    return prepare(list(argv[1:]))
