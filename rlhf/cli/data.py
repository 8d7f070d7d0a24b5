"""`rlhf data prepare TASK --out DIR`: the one `data` action; its flags are `rlhf.data.prepare`'s, and
`rlhf data prepare preferences ...`'s are `rlhf.cli.prepare_preferences`'s (it samples a model, so it
runs a graph: that belongs above the data layer)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["data_main"]


def data_main(argv: Sequence[str]) -> int:
    """Hand `prepare`'s arguments to `rlhf.data.prepare` (imported then); usage for anything else."""
    if not argv or argv[0] != "prepare":
        print("usage: rlhf data prepare TASK --out DIR   (`rlhf data prepare --help`: the tasks and options)\n"
              "       rlhf data prepare preferences --model M --data PROMPTS --out DIR   (preference pairs)")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    if len(argv) > 1 and argv[1] == "preferences":
        from rlhf.cli.prepare_preferences import prepare_preferences_main

        return prepare_preferences_main(list(argv[2:]))
    from rlhf.data.prepare import main as prepare

    return prepare(list(argv[1:]))
