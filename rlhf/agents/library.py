"""Ready-made tools: exact integer addition (a calculator) and Python run in the code sandbox.

Each is a typed function with a documented signature, so `Tool` derives its schema; put them in
an environment by reference: `fdl.Partial(ToolEnvironment, tools=[add])`.
"""

from __future__ import annotations

from collections.abc import Mapping

from rlhf.agents.tools import ToolCall
from rlhf.rewards.sandbox import SandboxLimits, isolation_available, run_program


def add(a: int, b: int) -> int:
    """Add two integers exactly.

    Args:
        a: the first addend
        b: the second addend
    """
    return a + b


def addition_calls(row: Mapping) -> list[ToolCall]:
    """The call of `add` that answers a long-addition row (`extra_info` a, b): for SFT demonstrations."""
    extra = row["extra_info"]
    return [ToolCall("add", {}, (int(extra["a"]), int(extra["b"])))]


def addition_code_calls(row: Mapping) -> list[ToolCall]:
    """The `python` call that answers a long-addition row: a program printing the sum (for demonstrations)."""
    extra = row["extra_info"]
    return [ToolCall("python", {"code": f"print({int(extra['a'])} + {int(extra['b'])})\n"})]


PYTHON_LIMITS = SandboxLimits(timeout_s=5.0, memory_mb=512, max_processes=8, max_output_bytes=4096)
"""What one `python` call may use (rlhf.rewards.sandbox: the sandbox code rewards run programs in)."""


def python(code: str) -> str:
    """Run a Python program and return what it prints.

    Args:
        code: the program (standard library only); print the values you need
    """
    result = run_program({"main.py": code}, "", PYTHON_LIMITS, isolated=isolation_available())
    if result.timed_out:
        return f"error: the program ran longer than {PYTHON_LIMITS.timeout_s:g} s and was stopped"
    out = result.stdout.strip()
    if result.exit_code:
        tail = result.stderr.strip().splitlines()[-1:] or [f"exit code {result.exit_code}"]
        out = (out + "\n" if out else "") + f"error: {tail[0]}"
    return out or "(the program printed nothing)"
