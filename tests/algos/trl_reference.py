"""TRL 1.16 as a reference for the preference losses, where it can be imported.

TRL is not a dependency of rlhf. The golden tests import its trainer modules (which need only torch,
transformers, accelerate and datasets, all installed here) and call the loss code on fixed numbers; where
TRL is absent they skip with how to run them:

    pip download trl==1.16.0 --no-deps -d /tmp/trl && unzip -q /tmp/trl/trl-1.16.0-*.whl -d /tmp/trl/x
    RLHF_TRL_PATH=/tmp/trl/x pytest tests/algos/test_preference_loss.py tests/algos/test_reward_model_loss.py

(the extracted wheel is put on sys.path; nothing is installed into the project's environment). The tables of
hand-computed values in the same files run everywhere.
"""

from __future__ import annotations

import importlib
import os
import sys
import types

import pytest

TRL_VERSION = "1.16.0"


def trl_module(name: str) -> types.ModuleType:
    """`importlib.import_module(name)` of TRL 1.16 (from $RLHF_TRL_PATH if set); skips the test where absent."""
    path = os.environ.get("RLHF_TRL_PATH")
    if path and path not in sys.path:
        sys.path.insert(0, path)
    try:
        trl = importlib.import_module("trl")
    except ImportError:
        pytest.skip(f"TRL {TRL_VERSION} is not importable: set RLHF_TRL_PATH to an extracted trl-{TRL_VERSION} wheel "
                    "(see tests/algos/trl_reference.py)")
    if trl.__version__ != TRL_VERSION:
        pytest.skip(f"the golden values are TRL {TRL_VERSION}'s; found TRL {trl.__version__}")
    return importlib.import_module(name)
