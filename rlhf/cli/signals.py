"""How the command line's processes treat Ctrl-C and SIGTERM."""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["honour_interrupts", "interrupt"]


def honour_interrupts() -> None:
    """Make SIGINT (Ctrl-C) stop this process even when it was started with SIGINT ignored.

    A shell starts background jobs (`cmd &`, CI scripts) with SIGINT ignored, and Python then
    installs no KeyboardInterrupt handler, so `rlhf ui` would never stop aim up and a sweep's
    members would not close their runs as interrupted when asked to. Entry points call this
    first; a handler someone installed on purpose is left alone.
    """
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def interrupt(signum: int, frame: Any) -> None:
    """A signal handler that stops the process like Ctrl-C (`KeyboardInterrupt`): for SIGTERM."""
    raise KeyboardInterrupt
