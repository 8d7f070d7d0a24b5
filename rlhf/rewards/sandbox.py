"""Run an untrusted Python program with limits: the engine under `code_score`.

`run_program(files, stdin, limits, isolated=...)` runs `python -I -S -B main.py` (standard
library only, no site-packages, no user environment) in a fresh directory holding `files`,
and returns its exit code and capped output. Two levels of containment:

**Isolated** (Linux, as root or with CAP_SYS_ADMIN; probed once by `isolation_available`):
fresh mount, network, PID, IPC and UTS namespaces; a chroot into a small tmpfs
(`disk_mb`) holding only read-only binds of /usr, /lib*, /bin, /sbin, /etc/ld.so.cache
and the Python installation, four /dev nodes, an empty /tmp and the working directory
/work; an unprivileged uid of its own (no capabilities, `no_new_privs`); rlimits on CPU,
address space, processes, file size and open files. So the program cannot reach any
network (its namespace has only a loopback that is down), cannot see the host's other
files (/root, /home, /tmp, the repository, ...) or processes, cannot fork past
`max_processes`, and everything it starts dies with it: on a timeout the namespace's
init is killed and the kernel kills every process inside, even ones that left the session.

**Plain** (where namespaces are refused: not root, or seccomp in a container): rlimits, a
new session killed as a group on timeout, a temporary working directory, an empty
environment and isolated mode `-I`. It does NOT stop reading files the host user can
read, network access, a fork bomb (no process limit: RLIMIT_NPROC would count all of the
host user's processes, and root ignores it), or processes that leave the session.

In both modes a run dies with the process that started it (PR_SET_PDEATHSIG), e.g. a
reward worker killed for its own timeout, and its temporary directory is removed (by the
next run in a later process, if the scorer died first).

Not contained in either mode: up to `timeout_s` of wall clock and CPU, and `memory_mb` of
address space per process (so up to `max_processes` x `memory_mb` in all); reads of
world-readable system files (/usr); kernel exploits. Linux only.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping

from rlhf.rewards import _sandbox_launcher

logger = logging.getLogger(__name__)

_LAUNCHER = os.path.abspath(_sandbox_launcher.__file__)
_DIR_PREFIX = "rlhf-sandbox-"  # then "<pid of the scorer process>-<random>"
_READ_ONLY = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/localtime")
"""Host paths visible (read-only) inside an isolated sandbox, besides the Python installation."""


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (a host problem, not the program's fault)."""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """What one run may use (`code_score` holds the defaults of the first four)."""

    timeout_s: float  # wall clock; the whole sandbox is killed after it (CPU limit: +1 s)
    memory_mb: int  # address space (RLIMIT_AS) of each process
    max_processes: int  # RLIMIT_NPROC of the sandbox's own uid (isolated mode only)
    max_output_bytes: int  # stdout/stderr kept, and RLIMIT_FSIZE of every file written
    disk_mb: int = 64  # size of the isolated sandbox's tmpfs (its /work and /tmp)
    max_open_files: int = 64  # RLIMIT_NOFILE


@dataclasses.dataclass
class RunResult:
    """How a run ended. exit_code: 128 + N when killed by signal N; None after a timeout."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    isolated: bool
    wall_s: float
    uid: int | None = None  # the uid the program ran as (isolated mode), when it got that far


@functools.cache
def isolation_available() -> bool:
    """Whether the isolated sandbox works here (probed once per process with a tiny program)."""
    if not sys.platform.startswith("linux"):
        return False
    limits = SandboxLimits(timeout_s=10.0, memory_mb=256, max_processes=8, max_output_bytes=1024)
    try:
        result = run_program({"main.py": "print('ok')"}, "", limits, isolated=True)
    except SandboxError as err:
        logger.warning("code sandbox: Linux namespaces are not usable here (%s); programs run with "
                       "rlimits only, without network or filesystem isolation", err)
        return False
    return result.stdout.strip() == "ok"


def _python() -> tuple[str, str]:
    """(interpreter, installation prefix) of the base Python under this one (outside any venv)."""
    executable = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(executable), sys.base_prefix


def run_program(files: Mapping[str, str], stdin: str, limits: SandboxLimits, *, isolated: bool) -> RunResult:
    """Write `files` (name -> text; "main.py" is run) to a fresh directory and run them.

    isolated: run in the namespace sandbox (`SandboxError` if it cannot be set up) or plain.
    """
    if "main.py" not in files or any(os.sep in name or name.startswith(".") for name in files):
        raise ValueError(f"run_program: files must be plain names including 'main.py', got {sorted(files)}")
    python, prefix = _python()
    _remove_orphaned_dirs()
    base = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-")
    try:
        work, root = os.path.join(base, "work"), os.path.join(base, "root")
        os.mkdir(work)
        os.mkdir(root)
        os.chmod(work, 0o755)
        for name, text in files.items():
            with open(os.path.join(work, name), "w", encoding="utf-8") as f:
                f.write(text)
        with open(os.path.join(base, "stdin"), "w", encoding="utf-8") as f:
            f.write(stdin)
        status_r, status_w = os.pipe()
        args = [
            "1" if isolated else "0", python, root, work, str(status_w), str(os.getpid()), str(limits.timeout_s),
            *(str(int(v)) for v in (limits.memory_mb, limits.max_processes, limits.max_output_bytes,
                                    limits.disk_mb, limits.max_open_files)),
            *_READ_ONLY, prefix,
        ]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/work" if isolated else work}
        start = time.monotonic()
        with open(os.path.join(base, "stdin"), "rb") as fin, open(os.path.join(base, "stdout"), "wb") as fout, \
                open(os.path.join(base, "stderr"), "wb") as ferr:
            try:
                proc = subprocess.Popen(
                    [python, "-I", "-S", "-B", _LAUNCHER, *args],
                    stdin=fin, stdout=fout, stderr=ferr, cwd=work, env=env,
                    start_new_session=True, pass_fds=(status_w,),
                )
            finally:
                os.close(status_w)
            timed_out = not _wait(proc, limits.timeout_s)
            _kill_group(proc.pid)  # after a timeout; in plain mode also what a program left running
            proc.wait()
            wall_s = time.monotonic() - start
        status = _read_all(status_r)
        if "error:" in status:
            raise SandboxError(f"could not start the code sandbox: {status[status.index('error:') + 6:].strip()}")
        ok = [line.split() for line in status.splitlines() if line.startswith("ok")]
        if not ok and not timed_out:
            raise SandboxError(f"could not start the code sandbox: the launcher exited with {proc.returncode} "
                               f"before the program ran; stderr: {_read_capped(os.path.join(base, 'stderr'), 500)}")
        code = proc.returncode
        return RunResult(
            exit_code=None if timed_out else (128 - code if code < 0 else code),
            stdout=_read_capped(os.path.join(base, "stdout"), limits.max_output_bytes),
            stderr=_read_capped(os.path.join(base, "stderr"), limits.max_output_bytes),
            timed_out=timed_out,
            isolated=isolated,
            wall_s=wall_s,
            uid=int(ok[0][1]) if ok and len(ok[0]) > 1 else None,
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


@functools.cache
def _remove_orphaned_dirs() -> None:
    """Once per process: delete run directories left by processes that died mid-run (e.g. a
    reward worker killed for a timeout); their names carry the pid that made them."""
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        if not name.startswith(_DIR_PREFIX):
            continue
        pid = name[len(_DIR_PREFIX):].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait for `proc` to exit; False if it is still running after `timeout_s`.

    A pidfd wakes us the moment it exits (Popen.wait(timeout) polls with sleeps of up to 50 ms).
    """
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout_s)
        return bool(ready)
    finally:
        os.close(pidfd)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_all(fd: int) -> str:
    """What the launcher reported on the status pipe (all its writers have exited by now)."""
    chunks = []
    try:
        os.set_blocking(fd, False)
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def _read_capped(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")
