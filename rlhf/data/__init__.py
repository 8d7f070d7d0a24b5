"""Prompt data: the row schema, file I/O with row-level errors, and offline task generators (ours and reasoning-gym's)."""

from rlhf.data.files import MissingDataFile, ReadReport, fingerprint_rows, read_rows, write_rows
from rlhf.data.generators import arithmetic_rows, countdown_rows, gsm8k_like_rows
from rlhf.data.reasoning_gym import reasoning_gym_rows
from rlhf.data.schema import DataError, ground_truth, to_python, validate_row

__all__ = [
    "DataError",
    "MissingDataFile",
    "ReadReport",
    "arithmetic_rows",
    "countdown_rows",
    "fingerprint_rows",
    "ground_truth",
    "gsm8k_like_rows",
    "read_rows",
    "reasoning_gym_rows",
    "to_python",
    "validate_row",
    "write_rows",
]
