"""Code reward: run the response's program against test cases in a sandbox (see `sandbox.py`).

The program is the last ```python (or ```py / ```python3) fenced block of the response, or
the whole response when it has none. The ground truth is a JSON string (or a dict) with
either or both kinds of test case:

- `{"inputs": [...], "outputs": [...]}`: stdin/stdout tests, as verl's "prime code"
  reward and TACO/APPS/CodeContests data store them. Each input is fed to the program on
  stdin; it passes when its stdout equals the expected output, ignoring whitespace at
  line ends and blank lines at the end. A list of strings counts as lines joined by
  "\\n". Call-based tests (`"fn_name"`) are not supported.
- `{"asserts": ["assert f(1) == 2", ...]}`: MBPP/HumanEval-style; each statement runs
  after the program (with `__name__ == "solution"`, so a main guard does not run) and
  passes when it raises nothing. A random token printed by the harness after the assert
  ensures an early `exit(0)` does not pass; a program that inspects the harness's frames
  could still forge it (stdin/stdout tests compare output outside the process: use them
  where the reward must be unforgeable).

Score: the fraction of tests passed. Each test is a separate sandboxed run (~0.1 s of
start-up each), so a hang or crash in one does not affect the others. Under a
`RewardManager(timeout_s=...)`, give the manager room for every test of a row (tests x
`timeout_s` here), or it kills the whole row first; its sandboxes die with it.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping

from rlhf.rewards.sandbox import SandboxError, SandboxLimits, isolation_available, run_program

_FENCE = re.compile(r"```(?:python3?|py)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

_STDIO_MAIN = """\
import builtins, sys
builtins.exit = builtins.quit = sys.exit  # as `site` would (the sandbox runs python -S)
sys.argv = ["solution.py"]
with open("solution.py", encoding="utf-8") as _f:
    _code = compile(_f.read(), "solution.py", "exec")
del _f
exec(_code, {"__name__": "__main__", "__file__": "solution.py", "__builtins__": builtins})
"""

_ASSERT_MAIN = """\
import builtins, os, sys
builtins.exit = builtins.quit = sys.exit

def _run():
    token = sys.stdin.readline().strip()
    scope = {"__name__": "solution", "__file__": "solution.py", "__builtins__": builtins}
    for name in ("solution.py", "test.py"):
        with open(name, encoding="utf-8") as f:
            exec(compile(f.read(), name, "exec"), scope)
    sys.stdout.flush()
    os.write(1, ("\\n" + token + "\\n").encode())

_run()
"""


def extract_program(solution_str: str) -> str:
    """The last ```python fenced block's code, or the whole text when there is none."""
    blocks = _FENCE.findall(solution_str)
    return blocks[-1] if blocks else solution_str


def _lines(value: object, field: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    raise ValueError(f"code_score: every entry of {field!r} must be a string or a list of strings, got {value!r:.80}")


def parse_tests(ground_truth: str | Mapping) -> tuple[list[tuple[str, str]], list[str]]:
    """(stdin/stdout pairs, assert statements) from the ground truth (see the module docstring)."""
    try:
        data = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    except json.JSONDecodeError as err:
        raise ValueError(
            f"code_score: ground truth is not JSON ({err.msg}): {ground_truth[:80]!r}. Fix: store "
            '{"inputs": [...], "outputs": [...]} or {"asserts": [...]} as a JSON string.'
        ) from err
    if not isinstance(data, Mapping) or not ({"inputs", "outputs", "asserts"} & set(data)):
        raise ValueError(
            f"code_score: ground truth {str(ground_truth)[:80]!r} has no test cases. Fix: store "
            '{"inputs": [...], "outputs": [...]} (stdin/stdout) or {"asserts": [...]}.'
        )
    if data.get("fn_name"):
        raise ValueError(
            f"code_score: call-based tests (fn_name={data['fn_name']!r}) are not supported. Fix: "
            'convert them to {"asserts": ["assert fn(...) == ..."]}.'
        )
    inputs, outputs = data.get("inputs", []), data.get("outputs", [])
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise ValueError(
            f"code_score: 'inputs' and 'outputs' must be lists of equal length, got "
            f"{type(inputs).__name__} of {len(inputs) if isinstance(inputs, list) else '?'} and "
            f"{type(outputs).__name__} of {len(outputs) if isinstance(outputs, list) else '?'}"
        )
    asserts = data.get("asserts", [])
    if not isinstance(asserts, list) or not all(isinstance(a, str) for a in asserts):
        raise ValueError(f"code_score: 'asserts' must be a list of strings, got {asserts!r:.80}")
    stdio = [(_lines(i, "inputs"), _lines(o, "outputs")) for i, o in zip(inputs, outputs)]
    if not stdio and not asserts:
        raise ValueError("code_score: the ground truth lists no test cases; a score would be meaningless")
    return stdio, asserts


def normalize_output(text: str) -> str:
    """Output as compared: whitespace at line ends and blank lines at the end removed."""
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def code_score(
    solution_str: str,
    ground_truth: str | Mapping,
    extra_info: dict | None = None,
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 256,
    max_processes: int = 16,
    max_output_bytes: int = 1 << 20,
    isolation: bool | None = None,
    stop_after_timeout: bool = True,
) -> float:
    """The fraction of the ground truth's tests that the response's program passes.

    timeout_s: wall-clock limit of each test run.
    memory_mb: address-space limit of each process of the program.
    max_processes: processes (and threads) the program may have at once (isolated only).
    max_output_bytes: stdout kept per run; also the largest file it may write.
    isolation: True requires the namespace sandbox, False never uses it, None uses it
      where available (logging a warning once where not).
    stop_after_timeout: after a test times out, count the remaining tests as failed
      without running them (a program that hangs once usually hangs again).
    """
    stdio, asserts = parse_tests(ground_truth)
    isolated = _isolated(isolation)
    limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, max_processes=max_processes,
                           max_output_bytes=max_output_bytes)
    program = extract_program(solution_str)
    passed, total = 0, len(stdio) + len(asserts)
    runs = [({"main.py": _STDIO_MAIN, "solution.py": program}, stdin, expected, None) for stdin, expected in stdio]
    for statement in asserts:
        token = secrets.token_hex(16)
        files = {"main.py": _ASSERT_MAIN, "solution.py": program, "test.py": statement}
        runs.append((files, token + "\n", None, token))
    for files, stdin, expected, token in runs:
        result = run_program(files, stdin, limits, isolated=isolated)
        if result.exit_code == 0:
            if token is not None:
                passed += result.stdout.rstrip().endswith(token)
            else:
                passed += normalize_output(result.stdout) == normalize_output(expected)
        if result.timed_out and stop_after_timeout:
            break
    return passed / total


def _isolated(isolation: bool | None) -> bool:
    if isolation is False:
        return False
    available = isolation_available()
    if isolation and not available:
        raise SandboxError(
            "code_score(isolation=True): the namespace sandbox is not available here (it needs Linux "
            "and root or CAP_SYS_ADMIN, and unshare allowed by seccomp). Fix: run where it is, or pass "
            "isolation=None to fall back to rlimits only (no network or file isolation)."
        )
    return available
