"""The sandbox launcher: `python -I -S -B _sandbox_launcher.py ARGS...` (see `sandbox.py`).

It runs as the host user, builds the sandbox and execs `python -I -S -B main.py` inside
it. It imports only os, sys, ctypes and resource (each run pays for its start-up), takes
its arguments positionally (no json), and reports setup failures on a status pipe that
the program cannot write to, so a program cannot pass off its failure as the host's.

Arguments: isolated(0/1) python root work status_fd parent_pid timeout_s memory_mb
max_processes max_output_bytes disk_mb max_open_files read_only_path...
"""

import ctypes
import os
import resource
import sys

SETUP_FAILED = 125
UID_BASE, UID_SPAN = 100_000, 100_000
"""An isolated program runs as uid = gid = UID_BASE + launcher pid % UID_SPAN: a user of its own
(no such account exists), so RLIMIT_NPROC counts only its processes, and it can signal no others."""
_SIGKILL = 9
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWPID, _CLONE_NEWNET = 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT = 1, 2, 4, 32
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_DEVICES = ("null", "zero", "random", "urandom")


def main(argv: list) -> int:
    """Run the program (isolated or plain) and return its exit status (128 + signal if killed)."""
    isolated, python, root, work = argv[0] == "1", argv[1], argv[2], argv[3]
    status_fd, parent = int(argv[4]), int(argv[5])
    limits = dict(zip(
        ("timeout_s", "memory_mb", "max_processes", "max_output_bytes", "disk_mb", "max_open_files"),
        (float(argv[6]), *map(int, argv[7:12])),
    ))
    read_only = argv[12:]
    os.set_inheritable(status_fd, False)  # closed on exec: the program cannot forge the status
    libc = ctypes.CDLL(None, use_errno=True)
    # Die with the scorer that started us (e.g. a reward worker killed for a timeout); the
    # signal survives exec, so in plain mode it covers the program itself.
    if libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0) != 0 or os.getppid() != parent:
        return SETUP_FAILED
    if not isolated:
        _exec_program(python, limits, status_fd, uid=None, libc=libc)  # does not return
    try:
        _check(libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS), "unshare")
        _check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
    except OSError as err:
        _report(status_fd, f"error: {err}")
        return SETUP_FAILED
    uid = UID_BASE + os.getpid() % UID_SPAN  # the launcher's pid in the host namespace: unique
    lifeline, lifeline_w = os.pipe()  # only the launcher keeps the write end open
    init = os.fork()
    if init == 0:  # pid 1 of the new PID namespace: when it exits, everything inside dies
        try:
            os.close(lifeline_w)
            _check(libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
            if _closed(lifeline):  # the launcher was killed before PDEATHSIG was armed
                os._exit(SETUP_FAILED)
            os.close(lifeline)
            _build_root(libc, root, work, read_only, limits["disk_mb"])
            program = os.fork()
            if program == 0:
                _exec_program(python, limits, status_fd, uid=uid, libc=libc)
            os._exit(_reap(program))
        except BaseException as err:  # noqa: BLE001 - report anything, never fall through
            _report(status_fd, f"error: {type(err).__name__}: {err}")
            os._exit(SETUP_FAILED)
    return _reap(init)


def _closed(fd: int) -> bool:
    """Whether every write end of the pipe `fd` is closed (reading gives EOF, not EAGAIN)."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 1) == b""
    except BlockingIOError:
        return False


def _reap(child: int) -> int:
    """Wait for `child`, reaping orphans on the way; its status as an exit code."""
    while True:
        pid, status = os.wait()
        if pid == child:
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what} failed: {os.strerror(errno)}")


def _report(fd: int, message: str) -> None:
    try:
        os.write(fd, (message.replace("\n", " ") + "\n").encode())
    except OSError:
        pass


def _bind(libc: ctypes.CDLL, source: str, target: str, read_only: bool) -> None:
    _check(libc.mount(source.encode(), target.encode(), None, _MS_BIND | _MS_REC, None), f"bind {source}")
    flags = _MS_BIND | _MS_REMOUNT | _MS_NOSUID | (_MS_RDONLY | _MS_NODEV if read_only else 0)
    _check(libc.mount(None, target.encode(), None, flags, None), f"remount {source}")


def _touch(path: str) -> None:
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def _build_root(libc: ctypes.CDLL, root: str, work: str, read_only: list, disk_mb: int) -> None:
    """Mount a tmpfs at `root`, expose the allowed host paths in it, copy `work` in, chroot."""
    options = f"size={disk_mb}m,mode=0755".encode()
    _check(libc.mount(b"tmpfs", root.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options), "mount tmpfs")
    for path in read_only:
        inside = root + path
        if os.path.islink(path):
            os.makedirs(os.path.dirname(inside), exist_ok=True)
            if not os.path.lexists(inside):
                os.symlink(os.readlink(path), inside)
        elif os.path.isdir(path):
            os.makedirs(inside, exist_ok=True)
            _bind(libc, path, inside, read_only=True)
        elif os.path.isfile(path):
            os.makedirs(os.path.dirname(inside), exist_ok=True)
            _touch(inside)
            _bind(libc, path, inside, read_only=True)
    os.mkdir(root + "/dev")
    for name in _DEVICES:
        _touch(f"{root}/dev/{name}")
        _bind(libc, f"/dev/{name}", f"{root}/dev/{name}", read_only=False)
    for name, mode in (("/tmp", 0o1777), ("/work", 0o777)):
        os.mkdir(root + name)
        os.chmod(root + name, mode)
    for name in os.listdir(work):  # the program's files, copied into the size-capped tmpfs
        with open(os.path.join(work, name), "rb") as src, open(f"{root}/work/{name}", "wb") as dst:
            dst.write(src.read())
    os.chroot(root)
    os.chdir("/work")


def _exec_program(python: str, limits: dict, status_fd: int, uid, libc) -> None:
    """Drop privileges (isolated mode), set the rlimits, exec `python main.py`; never returns."""
    try:
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        settings = [
            (resource.RLIMIT_CPU, int(limits["timeout_s"]) + 1),
            (resource.RLIMIT_AS, limits["memory_mb"] * 1024 * 1024),
            (resource.RLIMIT_FSIZE, limits["max_output_bytes"]),
            (resource.RLIMIT_NOFILE, limits["max_open_files"]),
            (resource.RLIMIT_CORE, 0),
        ]
        if uid is not None:  # RLIMIT_NPROC is not enforced for root, and counts per uid
            settings.append((resource.RLIMIT_NPROC, limits["max_processes"]))
        for kind, value in settings:
            resource.setrlimit(kind, (value, value))
        _report(status_fd, f"ok {uid if uid is not None else ''}")
        os.execv(python, [python, "-I", "-S", "-B", "main.py"])
    except BaseException as err:  # noqa: BLE001 - the status pipe carries it to the host
        _report(status_fd, f"error: {type(err).__name__}: {err}")
    os._exit(SETUP_FAILED)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
