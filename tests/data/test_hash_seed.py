"""call_with_fixed_hash_seed: results as under PYTHONHASHSEED=0 in any process, errors raised where it is called."""

import json
import os
import subprocess
import sys

import pytest

from rlhf.data.hash_seed import call_with_fixed_hash_seed, hash_seed_is_fixed

WORDS = [f"word{i}" for i in range(40)]


def _order_under(hash_seed: str) -> list[str]:
    """WORDS ordered by their hashes in a fresh interpreter with `hash_seed` (what orders a set's iteration)."""
    script = f"import json; print(json.dumps(sorted({WORDS!r}, key=hash)))"
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    return json.loads(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, check=True).stdout)


def test_a_set_order_is_the_one_of_hash_seed_zero_whatever_this_process_has():
    assert _order_under("1") != _order_under("2")  # what goes wrong without it: the order follows the hash seed
    assert call_with_fixed_hash_seed(sorted, WORDS, key=hash) == _order_under("0")
    assert call_with_fixed_hash_seed(sorted, WORDS, key=hash) == _order_under("0")  # again, from the same child


@pytest.mark.skipif(hash_seed_is_fixed(), reason="this test process already runs with PYTHONHASHSEED=0")
def test_one_child_serves_the_process_and_a_dead_one_is_replaced():
    child = call_with_fixed_hash_seed(os.getpid)
    assert child != os.getpid() and call_with_fixed_hash_seed(os.getpid) == child
    with pytest.raises(RuntimeError, match=r"computing _exit under PYTHONHASHSEED=0 exited with code 3"):
        call_with_fixed_hash_seed(os._exit, 3)
    assert call_with_fixed_hash_seed(os.getpid) not in (child, os.getpid())


def test_the_function_s_exception_is_raised_here():
    with pytest.raises(ValueError, match="invalid literal for int"):
        call_with_fixed_hash_seed(int, "seven")
    assert call_with_fixed_hash_seed(int, "7") == 7  # the child serves on after an exception


def test_a_process_with_hash_seed_zero_computes_in_itself():
    script = ("import os; from rlhf.data.hash_seed import call_with_fixed_hash_seed as call; "
              "print(call(os.getpid) == os.getpid())")
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "True"
