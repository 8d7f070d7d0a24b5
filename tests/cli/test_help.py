"""Every command of `rlhf` answers `--help` with its usage and exit status 0 (a user's first try)."""

import re

import pytest

from rlhf.cli import USAGE, main

COMMANDS = sorted({m.group(1) for m in re.finditer(r"^  rlhf (\w+)", USAGE, re.M)})


def test_the_usage_lists_the_commands():
    assert {"run", "plan", "show", "export", "models", "serve", "doctor", "rollouts", "generate", "eval"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_answers_help(command, capsys):
    try:
        status = main([command, "--help"])
    except SystemExit as exit_:  # argparse's --help
        status = exit_.code
    out = capsys.readouterr()
    assert status in (0, None), (command, out.out[-500:], out.err[-1500:])
    assert "usage" in (out.out + out.err).lower(), (command, out.out[-500:])
