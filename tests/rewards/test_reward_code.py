"""code_score: program extraction, test-case formats, fractions passed, and contained misbehaviour."""

import functools
import json
import os
import tempfile
import threading
import time

import pytest

from rlhf.rewards import RewardManager, SandboxError, code_score, default_scorers
from rlhf.rewards import code as code_module
from rlhf.rewards import sandbox
from rlhf.rewards.code import extract_program, normalize_output, parse_tests
from rlhf.rewards.sandbox import isolation_available

ADD = json.dumps({"inputs": ["1 2\n", "3 4\n", "10 20\n"], "outputs": ["3\n", "7", "30\n"]})
ADD_ASSERTS = json.dumps({"asserts": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]})
GOOD = "Read two numbers and print the sum:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\nDone."

isolated_only = pytest.mark.skipif(
    not isolation_available(),
    reason="the namespace sandbox needs Linux with root or CAP_SYS_ADMIN and unshare() allowed",
)


def test_extract_program():
    assert extract_program(GOOD) == "a, b = map(int, input().split())\nprint(a + b)\n"
    two = "```python\nfirst()\n```\ntext\n```py\nsecond()\n```"
    assert extract_program(two) == "second()\n"  # the last block
    assert extract_program("print(1)") == "print(1)"  # no fence: the whole response
    assert extract_program("```\nnot tagged\n```") == "```\nnot tagged\n```"


def test_parse_tests_formats_and_errors():
    assert parse_tests(ADD)[0][1] == ("3 4\n", "7")
    assert parse_tests({"inputs": [["1", "2"]], "outputs": [["3"]]}) == ([("1\n2", "3")], [])
    assert parse_tests(ADD_ASSERTS)[1][0] == "assert add(1, 2) == 3"
    with pytest.raises(ValueError, match="not JSON"):
        parse_tests("{oops")
    with pytest.raises(ValueError, match="has no test cases"):
        parse_tests('{"cases": []}')
    with pytest.raises(ValueError, match="equal length"):
        parse_tests('{"inputs": ["1"], "outputs": []}')
    with pytest.raises(ValueError, match="call-based tests"):
        parse_tests('{"inputs": [[1]], "outputs": [2], "fn_name": "f"}')
    with pytest.raises(ValueError, match="lists no test cases"):
        parse_tests('{"inputs": [], "outputs": []}')


def test_normalize_output():
    assert normalize_output("3  \n4\t\n\n\n") == normalize_output("3\n4") == "3\n4"
    assert normalize_output(" 3") != normalize_output("3")  # leading spaces count


def test_correct_partial_and_wrong_programs():
    assert code_score(GOOD, ADD) == 1.0
    partial = "```python\na, b = map(int, input().split())\nprint(a + b if a < 5 else 0)\n```"
    assert code_score(partial, ADD) == pytest.approx(2 / 3)
    assert code_score("print('hello')", ADD) == 0.0
    assert code_score("```python\ndef broken(:\n```", ADD) == 0.0
    assert code_score("import sys\nprint(sum(map(int, sys.stdin.read().split())))\nexit()", ADD) == 1.0


def test_assert_tests():
    assert code_score("def add(a, b):\n    return a + b", ADD_ASSERTS) == 1.0
    assert code_score("def add(a, b):\n    return a + b if a > 0 else 5", ADD_ASSERTS) == pytest.approx(2 / 3)
    # a main guard does not run (it would wait for input), the functions are still tested
    guarded = "def add(a, b):\n    return a + b\nif __name__ == '__main__':\n    print(add(int(input()), 1))"
    assert code_score(guarded, ADD_ASSERTS) == 1.0


@pytest.mark.parametrize("hack", ["import sys\nsys.exit(0)", "import os\nos._exit(0)", "exit()",
                                  "def add(a, b):\n    return -99\nimport os\nos.write(1, b'\\nok\\n')"])
def test_exiting_early_does_not_pass_asserts(hack):
    assert code_score(hack, ADD_ASSERTS) == 0.0


def test_an_infinite_loop_scores_zero_promptly():
    start = time.monotonic()
    assert code_score("while True:\n    pass", ADD, timeout_s=0.5) == 0.0
    assert time.monotonic() - start < 0.5 + 5.0  # one timeout, the other tests skipped (5 s: a busy machine)
    slow_first = "import sys\nx = int(input().split()[0])\nwhile x == 1:\n    pass\nprint(7)"
    # the first test hangs; without stop_after_timeout the rest still run (and the second passes)
    assert code_score(slow_first, ADD, timeout_s=0.5, stop_after_timeout=False) == pytest.approx(1 / 3)


@isolated_only
def test_misbehaving_programs_are_contained(tmp_path):
    secret = tmp_path / "answer.txt"
    secret.write_text("3\n")
    gt = json.dumps({"inputs": [""], "outputs": ["3"]})
    assert code_score(f"print(open({str(secret)!r}).read())", gt) == 0.0  # cannot read outside
    assert code_score("import socket\nsocket.create_connection(('127.0.0.1', 22))\nprint(3)", gt) == 0.0
    assert code_score("x = bytearray(1 << 31)\nprint(3)", gt) == 0.0
    start = time.monotonic()
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    assert code_score(bomb, gt, timeout_s=1.0) == 0.0
    assert time.monotonic() - start < 1.0 + 5.0


def test_isolation_required_but_missing(monkeypatch):
    monkeypatch.setattr(code_module, "isolation_available", lambda: False)
    with pytest.raises(SandboxError, match="isolation=True.*not available.*Fix"):
        code_score(GOOD, ADD, isolation=True)
    assert code_score(GOOD, ADD, isolation=None) == 1.0  # falls back to plain mode


def test_through_the_manager_and_its_workers():
    rows = [GOOD, "print(3)"]
    sequential = RewardManager(default_scorers())(rows, ["codecontests"] * 2, [ADD] * 2, [None] * 2)
    assert sequential.scores == [1.0, pytest.approx(1 / 3)]
    scorer = functools.partial(code_score, timeout_s=2.0)
    with RewardManager({"codecontests": scorer}, num_workers=1, timeout_s=30.0) as manager:
        assert manager(rows, ["codecontests"] * 2, [ADD] * 2, [None] * 2).scores == sequential.scores


def _pids_named(name: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/comm") as f:
                if f.read().strip() == name:
                    pids.append(int(entry))
        except (OSError, ValueError):
            continue
    return pids


def test_sandboxes_die_with_a_reward_worker_killed_for_its_timeout():
    # The program names itself (visible in the host's /proc) and sleeps far past the manager's timeout.
    marker = f"sbx{os.getpid() % 1_000_000}"
    program = f"import ctypes, time\nctypes.CDLL(None).prctl(15, {marker.encode()!r}, 0, 0, 0)\ntime.sleep(60)"
    seen, done = [], threading.Event()

    def watch():
        while not done.is_set():
            seen.extend(_pids_named(marker))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    scorer = functools.partial(code_score, timeout_s=60.0)
    truth = json.dumps({"inputs": [""], "outputs": [""]})
    try:
        with RewardManager({"code": scorer}, strict=False, num_workers=1, timeout_s=2.0) as manager:
            manager(["pass"], ["code"], [truth], [None])  # warm the worker up (imports, isolation probe)
            out = manager([program], ["code"], [truth], [None])
    finally:
        done.set()
        watcher.join()
    assert out.metrics["reward/timeouts"] == 1.0
    assert seen  # the sandboxed program was running while the worker scored it
    deadline = time.monotonic() + 5.0  # killed processes may take a moment to be reaped
    while _pids_named(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _pids_named(marker) == []  # it died with the worker, not 60 s later
    sandbox._remove_orphaned_dirs.__wrapped__()  # what the next process to run a sandbox does
    left = [name for name in os.listdir(tempfile.gettempdir()) if name.startswith("rlhf-sandbox-")]
    assert all(sandbox._alive(int(name.split("-")[2])) for name in left)  # the dead worker's run dir is gone
