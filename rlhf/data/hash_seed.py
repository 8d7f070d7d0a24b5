"""Call a function as an interpreter with a fixed hash seed would: for third-party code whose output follows set order.

Python salts the hashes of strings per process (PYTHONHASHSEED), so a set of strings iterates in a different order in
every process, and a generator that draws `rng.choice(list(letters - used))` draws different items from the same
seed (8 of reasoning-gym's 106 tasks do). `call_with_fixed_hash_seed(f, *args)` returns `f(*args)` as computed
under PYTHONHASHSEED=0: here when this process already runs with it, else in one child interpreter that this
process keeps for its life (started on first use, about 1.4 s with reasoning-gym's import; each call after costs its
own time plus pickling). `f` must be a module-level function, and its arguments and result picklable.
"""

from __future__ import annotations

import atexit
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, TypeVar

FIXED_HASH_SEED = "0"
"""PYTHONHASHSEED under which `call_with_fixed_hash_seed` computes (0: no salt, the same on every machine)."""

T = TypeVar("T")

_lock = threading.Lock()
_child: subprocess.Popen | None = None
_child_owner: int | None = None  # the pid that started `_child` (a forked process starts its own)


def hash_seed_is_fixed() -> bool:
    """Whether this process hashes strings as PYTHONHASHSEED=0 does."""
    return not sys.flags.hash_randomization


def call_with_fixed_hash_seed(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`function(*args, **kwargs)` computed under PYTHONHASHSEED=0; its exception, if it raises one, raised here."""
    if hash_seed_is_fixed():
        return function(*args, **kwargs)
    with _lock:
        child = _running_child()
        try:
            pickle.dump((function, args, kwargs), child.stdin)
            child.stdin.flush()
            outcome, value = pickle.load(child.stdout)
        except (BrokenPipeError, EOFError) as err:
            code = child.wait()
            _forget_child()
            raise RuntimeError(f"the interpreter computing {function.__qualname__} under PYTHONHASHSEED="
                               f"{FIXED_HASH_SEED} exited with code {code} (its error is above, on stderr)") from err
    if outcome == "error":
        raise value
    return value


def _running_child() -> subprocess.Popen:
    """This process's child interpreter, started if there is none (or it died, or it belongs to a parent)."""
    global _child, _child_owner
    if _child is None or _child_owner != os.getpid() or _child.poll() is not None:
        package_root = str(Path(__file__).resolve().parents[2])
        python_path = os.pathsep.join([package_root, *filter(None, [os.environ.get("PYTHONPATH")])])
        env = {**os.environ, "PYTHONHASHSEED": FIXED_HASH_SEED, "PYTHONPATH": python_path}
        _child = subprocess.Popen([sys.executable, "-c", f"from {__name__} import _serve; _serve()"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        _child_owner = os.getpid()
    return _child


def _forget_child() -> None:
    global _child
    _child = None


@atexit.register
def _stop_child() -> None:
    """Close the child's input (it exits at end of input) and wait for it, so no interpreter outlives us."""
    if _child is not None and _child_owner == os.getpid() and _child.poll() is None:
        _child.stdin.close()
        try:
            _child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _child.kill()


def _serve() -> None:
    """The child's loop: a pickled (function, args, kwargs) in, ("ok", result) or ("error", exception) out, until
    its input ends. What the functions print goes to stderr, so it cannot corrupt the replies."""
    requests, replies, sys.stdout = sys.stdin.buffer, sys.stdout.buffer, sys.stderr
    while True:
        try:
            function, args, kwargs = pickle.load(requests)
        except EOFError:
            return
        try:
            reply = pickle.dumps(("ok", function(*args, **kwargs)))
        except Exception as err:  # noqa: BLE001 - the caller raises it
            try:
                reply = pickle.dumps(("error", err))
            except Exception:  # noqa: BLE001 - an exception that does not pickle
                reply = pickle.dumps(("error", RuntimeError(f"{type(err).__name__}: {err}")))
        replies.write(reply)
        replies.flush()
