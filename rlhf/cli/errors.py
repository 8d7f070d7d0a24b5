"""How a command ends when it stops for a reason it can explain: one line on stderr, no traceback.

An error whose message already says what went wrong and how to go on (a checkpoint that
could not be written, a bad data row, a full disk, a placement Ray cannot make, ...) is
printed as `error: <message>` with exit status 1. Ctrl-C and SIGTERM print one line saying
what was stopped and how to resume, then end the process by that signal (status 130 / 143
in a shell), as a shell expects of an interrupted program. Anything else is a bug or an
unexpected failure: its traceback is kept.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from collections.abc import Iterator

__all__ = ["explained_errors", "one_line_errors"]


_EXPLAINED = {  # module: errors whose message is the whole story (each names the file, value or group and the fix)
    "rlhf.config.overrides": ("OverrideError",),
    "rlhf.data.schema": ("DataError",),
    "rlhf.models.importing": ("ModelImportError",),
    "rlhf.models.loading": ("ModelNotFoundError",),
    "rlhf.rewards.manager": ("ScorerError", "UnknownDataSourceError"),
    "rlhf.runtime.placement": ("PlacementError",),
    "rlhf.runtime.preflight": ("PreflightError",),
    "rlhf.runtime.ray_runtime": ("WorkerDiedError",),
    "rlhf.runtime.run_lock": ("RunFolderInUse",),
    "rlhf.runtime.stages": ("StageOutputError",),
    "rlhf.sweeps": ("SweepError",),
    "rlhf.trainers.checkpoint": ("CheckpointError",),
    "rlhf.trainers.rl": ("NonFiniteTrainingError",),
    "rlhf.workers.state_io": ("CheckpointFormatError", "CheckpointIOError"),
}


def explained_errors() -> tuple[type[BaseException], ...]:
    """The error classes of `_EXPLAINED` whose modules are loaded (an error raised by a module that is not
    loaded cannot be raised at all). Named rather than imported: `rlhf serve` and `rlhf --help` must not load
    torch, Ray and Aim for errors they never raise, nor a machine without Ray fail here with an ImportError."""
    return tuple(getattr(sys.modules[module], name) for module, names in _EXPLAINED.items()
                 if module in sys.modules for name in names)


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _cause(err: BaseException) -> BaseException:
    """The error a worker raised, for one that came back from a Ray actor (`RayTaskError.cause`)."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, BaseException) else err


def _disk_full(err: BaseException) -> OSError | None:
    """The `OSError` of a full disk or quota in `err` or its chain of causes, if any."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _DISK_FULL:
            return err
        err = err.__cause__ or err.__context__
    return None


@contextlib.contextmanager
def one_line_errors(resume: str | None = None) -> Iterator[None]:
    """Report an explained error, a full disk or an interrupt in one line and exit (see the module doc).

    `resume`: how to continue after an interrupt or a full disk (e.g. "run the same command again to
    resume from the newest checkpoint"), added to the line; None when there is nothing to resume. An
    explained error's own message says how to go on.
    """
    hint = f" {resume[0].upper()}{resume[1:]}." if resume else ""
    try:
        yield
    except KeyboardInterrupt as err:
        # the experiment runner raises SIGTERM as `Terminated`, a KeyboardInterrupt (rlhf.runtime.experiment)
        signum = signal.SIGTERM if type(err).__name__ == "Terminated" else signal.SIGINT
        what = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C (SIGINT)"
        print(f"\ninterrupted by {what}; stopped cleanly.{hint}", file=sys.stderr, flush=True)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # end by the signal, so the calling shell or script sees an interrupt
        raise  # not reached; keeps the type checker and a handler someone installed honest
    except BaseException as err:  # noqa: BLE001 - re-raised unless it is explained
        full = _disk_full(err)
        cause = _cause(err)
        if isinstance(cause, explained_errors()):
            sys.exit(f"error: {_text(cause)}")
        if full is not None:
            where = f" (writing {full.filename})" if full.filename else ""
            sys.exit(f"error: no space left on the device{where}. Free disk space or point the experiment's "
                     f"output_dir elsewhere.{hint}")
        raise


def _text(err: BaseException) -> str:
    return str(err).strip() or type(err).__name__
