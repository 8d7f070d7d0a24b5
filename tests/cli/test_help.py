"""Every command of `rlhf` answers `--help` with its usage and exit status 0 (a user's first try), and
`rlhf --help` lists every command of the one table, `rlhf.cli.COMMANDS`."""

import inspect

import pytest

from rlhf.cli import COMMANDS, main


def test_the_table_holds_the_commands():
    assert {"run", "plan", "show", "export", "models", "serve", "doctor", "rollouts", "generate", "eval", "probe",
            "data", "sft"} <= set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_table_entry_resolves_to_a_function_and_has_help_text(name):
    command = COMMANDS[name]
    function = command.function()  # imports the module: a typo in "module:function" fails here
    assert callable(function) and len(inspect.signature(function).parameters) >= 1, command.target
    assert command.forms and all(arguments and len(what) > 10 for arguments, what in command.forms), name


def test_the_usage_lists_every_command_with_its_forms(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("    ") and line.split()]
    assert [n for n in listed if n in COMMANDS] == list(COMMANDS), out  # each once, in the table's order
    for command in COMMANDS.values():
        for arguments, what in command.forms:
            assert f"{arguments}" in out and what in out


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_answers_help(command, capsys):
    try:
        status = main([command, "--help"])
    except SystemExit as exit_:  # argparse's --help
        status = exit_.code
    out = capsys.readouterr()
    assert status in (0, None), (command, out.out[-500:], out.err[-1500:])
    assert "usage" in (out.out + out.err).lower(), (command, out.out[-500:])
