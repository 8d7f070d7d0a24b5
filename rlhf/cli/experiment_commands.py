"""`rlhf run|plan|show experiments/x.py [--config CMD ...]`: an experiment file's command line, run, planned or shown.

Light to import: the experiment machinery (`rlhf.cli.experiment`: fiddle, the runtimes, torch) is
imported once a file is given, so `rlhf run --help` answers at once.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["plan_main", "run_main", "show_main"]


def _experiment_command(command: str, what: str, extra: list[str], argv: Sequence[str]) -> int:
    """Run `experiments/x.py`'s command line with `extra` flags after the user's; usage without a file."""
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: rlhf {command} experiments/x.py [--config CMD ...]\n\n  {what}")
        return 0 if argv else 2
    from rlhf.cli.experiment import load_experiment, run_cli

    run_cli(load_experiment(argv[0]), [*argv[1:], *extra])
    return 0


def run_main(argv: Sequence[str]) -> int:
    """`rlhf run`: what `python experiments/x.py` does."""
    return _experiment_command("run", "run an experiment (the file's own flags: python experiments/x.py --help)",
                               [], argv)


def plan_main(argv: Sequence[str]) -> int:
    """`rlhf plan`: each stage's plan and memory per device; `rlhf plan --memory CONFIG`: a model config alone."""
    if argv and argv[0] == "--memory":
        from rlhf.cli.memory_plan import memory_plan_main

        return memory_plan_main(argv[1:])
    return _experiment_command("plan", "print each stage's execution plan and its memory per device; "
                               "`rlhf plan --memory --help` for a model config alone", ["--print_plan"], argv)


def show_main(argv: Sequence[str]) -> int:
    """`rlhf show`: the graph after overrides, and where each value was set."""
    return _experiment_command("show", "print the graph after overrides, and where each value was set",
                               ["--print_graph"], argv)
