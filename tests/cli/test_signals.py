"""Entry points stop on SIGINT even when started as a background job (SIGINT inherited as ignored)."""

import signal
import subprocess
import sys
import time

import pytest

SLEEPER = """
import sys, time
if sys.argv[1] == "honour":
    from rlhf.cli.signals import honour_interrupts
    honour_interrupts()
print("ready", flush=True)
time.sleep(30)
"""


def start_ignoring_sigint(mode: str) -> subprocess.Popen:
    """A child started the way a shell starts `cmd &`: SIGINT ignored from the start."""
    return subprocess.Popen(
        [sys.executable, "-c", SLEEPER, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )


def interrupt(proc: subprocess.Popen) -> float:
    assert proc.stdout.readline().strip() == "ready"
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return float("inf")
    return time.monotonic() - start


def test_sigint_stops_an_entry_point_started_with_sigint_ignored():
    proc = start_ignoring_sigint("honour")
    assert interrupt(proc) < 5
    assert "KeyboardInterrupt" in proc.stderr.read()


@pytest.mark.parametrize("mode", ["plain"])
def test_without_it_the_child_ignores_sigint(mode):
    """The control: what `rlhf ui` did in a CI job (it never stopped aim up)."""
    assert interrupt(start_ignoring_sigint(mode)) == float("inf")
