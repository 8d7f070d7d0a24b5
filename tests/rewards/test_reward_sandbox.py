"""The code sandbox contains what it promises: hangs, fork bombs, memory hogs, big outputs,
reads outside its directory, network access; and the host is left as it was."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from rlhf.rewards import _sandbox_launcher, sandbox
from rlhf.rewards.sandbox import RunResult, SandboxError, SandboxLimits, isolation_available, run_program

LIMITS = SandboxLimits(timeout_s=10.0, memory_mb=256, max_processes=8, max_output_bytes=4096)
"""Limits for tests that should end well before the timeout (generous: the machine is shared)."""

isolated_only = pytest.mark.skipif(
    not isolation_available(),
    reason="the namespace sandbox needs Linux with root or CAP_SYS_ADMIN and unshare() allowed",
)
MODES = [pytest.param(True, id="isolated", marks=isolated_only), pytest.param(False, id="plain")]


def run(source, stdin="", *, isolated=True, limits=LIMITS) -> RunResult:
    return run_program({"main.py": source}, stdin, limits, isolated=isolated)


SLACK_S = 5.0
"""How much later than its timeout a run may return on this shared, often busy machine."""


def gone(uid: int, within_s: float = 5.0) -> bool:
    """Whether no process of `uid` is left (SIGKILLed processes may take a moment to be reaped)."""
    deadline = time.monotonic() + within_s
    while processes_of(uid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def processes_of(uid: int) -> list[int]:
    """Pids of processes running as `uid` (a sandbox's own uid: none should outlive the run)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/status") as f:
                found = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
        except (OSError, ValueError, StopIteration):
            continue
        if found == uid:
            pids.append(int(entry))
    return pids


@pytest.mark.parametrize("isolated", MODES)
def test_runs_a_program_with_stdin(isolated):
    result = run("import sys\nprint(sum(map(int, sys.stdin.read().split())))", "1 2 3\n", isolated=isolated)
    assert (result.exit_code, result.stdout, result.timed_out) == (0, "6\n", False)
    assert result.isolated is isolated and (result.uid is not None) is isolated
    failed = run("raise SystemExit(3)", isolated=isolated)
    assert failed.exit_code == 3


@pytest.mark.parametrize("isolated", MODES)
def test_infinite_loop_is_killed_at_the_timeout(isolated):
    limits = SandboxLimits(timeout_s=1.0, memory_mb=256, max_processes=8, max_output_bytes=4096)
    start = time.monotonic()
    result = run("while True:\n    pass", isolated=isolated, limits=limits)
    assert result.timed_out and result.exit_code is None
    assert 1.0 <= time.monotonic() - start < 1.0 + SLACK_S


@pytest.mark.parametrize("isolated", MODES)
def test_memory_hog_fails_without_taking_the_memory(isolated):
    result = run("x = bytearray(2 << 30)\nprint('allocated')", isolated=isolated)
    assert result.exit_code == 1 and "MemoryError" in result.stderr and result.stdout == ""
    small = SandboxLimits(timeout_s=10.0, memory_mb=64, max_processes=8, max_output_bytes=4096)
    grows = run("x = []\nwhile True:\n    x.append(bytearray(1 << 20))", isolated=isolated, limits=small)
    assert grows.exit_code == 1 and "MemoryError" in grows.stderr


@pytest.mark.parametrize("isolated", MODES)
def test_output_is_capped(isolated):
    result = run("while True:\n    print('x' * 1000)", isolated=isolated)
    assert len(result.stdout) == LIMITS.max_output_bytes and result.exit_code != 0  # RLIMIT_FSIZE stopped it
    assert not result.timed_out


@isolated_only
def test_fork_bomb_is_capped_and_leaves_nothing_behind():
    # Bounded first: children that sleep, so the count shows the cap (the program itself is one).
    counted = run(
        "import os, time\nn = 0\nfor _ in range(100):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n"
        "    n += 1\nprint(n)"
    )
    assert counted.stdout == f"{LIMITS.max_processes - 1}\n"
    # The real thing: every process forks forever; the sandbox is killed at its timeout.
    limits = SandboxLimits(timeout_s=1.5, memory_mb=256, max_processes=8, max_output_bytes=4096)
    start = time.monotonic()
    bomb = run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
               limits=limits)
    assert bomb.timed_out and time.monotonic() - start < 1.5 + SLACK_S
    assert bomb.uid is not None and bomb.uid >= _sandbox_launcher.UID_BASE
    assert gone(bomb.uid) and gone(counted.uid)


@isolated_only
def test_processes_that_leave_the_session_die_with_the_sandbox():
    result = run("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')")
    assert result.stdout == "parent done\n"
    assert gone(result.uid)


@isolated_only
def test_files_outside_the_sandbox_are_not_visible(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    for path in (secret, "/root", "/etc/passwd", os.path.abspath(__file__)):
        result = run(f"print(open({str(path)!r}).read())")
        assert result.exit_code == 1 and result.stdout == ""
        assert "FileNotFoundError" in result.stderr or "IsADirectoryError" in result.stderr
    listing = run("import json, os\nprint(json.dumps([os.listdir('/'), os.getcwd(), os.getuid()]))")
    names, cwd, uid = json.loads(listing.stdout)
    # /root holds only the Python installation when Python lives there (as with pyenv)
    assert set(names) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "opt", "root", "sbin", "tmp", "usr", "work"}
    assert cwd == "/work" and uid == listing.uid and uid >= _sandbox_launcher.UID_BASE
    readonly = run("open('/usr/evil', 'w')")
    assert readonly.exit_code == 1 and ("Read-only" in readonly.stderr or "Permission" in readonly.stderr)


@isolated_only
def test_disk_writes_are_capped():
    limits = SandboxLimits(timeout_s=10.0, memory_mb=256, max_processes=8, max_output_bytes=1 << 20, disk_mb=4)
    result = run("i = 0\nwhile True:\n    open(f'f{i}', 'w').write('y' * (1 << 20))\n    i += 1", limits=limits)
    assert result.exit_code == 1 and "No space left" in result.stderr


@isolated_only
def test_no_network():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        connect = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        result = run(connect + "print('connected')")
        server.setblocking(False)
        with pytest.raises(BlockingIOError):  # the kernel would have queued a connection that got through
            server.accept()
    assert result.exit_code == 1 and "connected" not in result.stdout
    assert "Network is unreachable" in result.stderr


def test_plain_mode_runs_in_a_fresh_directory_with_an_empty_environment():
    # Plain mode does not hide the host's files or network (see sandbox.py); this is what it does promise.
    result = run("import json, os, sys\nprint(json.dumps([os.getcwd(), sorted(os.environ), sys.flags.isolated]))",
                 isolated=False)
    cwd, env, isolated_flag = json.loads(result.stdout)
    assert "rlhf-sandbox-" in cwd and not os.path.exists(cwd)  # deleted afterwards
    assert env == ["HOME", "LANG", "PATH"] and isolated_flag == 1


@pytest.mark.parametrize("isolated", MODES)
def test_a_program_cannot_forge_a_sandbox_failure(isolated):
    # The launcher's status pipe is closed on exec: writing "error:" to every fd changes nothing.
    result = run("import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'error: fake')\n"
                 "    except OSError:\n        pass\nprint('ok')", isolated=isolated)
    assert result.stdout == "ok\n"


def test_bad_files_are_refused():
    with pytest.raises(ValueError, match="including 'main.py'"):
        run_program({"other.py": ""}, "", LIMITS, isolated=False)
    with pytest.raises(ValueError, match="plain names"):
        run_program({"main.py": "", "../x.py": ""}, "", LIMITS, isolated=False)
    assert issubclass(SandboxError, RuntimeError)


def test_directories_of_dead_scorer_processes_are_removed(tmp_path, monkeypatch):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    monkeypatch.setattr(sandbox.tempfile, "gettempdir", lambda: str(tmp_path))
    orphan = tmp_path / f"rlhf-sandbox-{int(dead.stdout)}-abc"
    mine = tmp_path / f"rlhf-sandbox-{os.getpid()}-def"
    other = tmp_path / "unrelated-123"
    for path in (orphan, mine, other):
        (path / "work").mkdir(parents=True)
    sandbox._remove_orphaned_dirs.__wrapped__()
    assert not orphan.exists() and mine.exists() and other.exists()
