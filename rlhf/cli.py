"""The `rlhf` command: `rlhf run|plan|show EXPERIMENT.py [--config ...]`, `rlhf data prepare ...`."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

USAGE = """usage: rlhf COMMAND ...

  rlhf run  experiments/x.py [--config CMD ...]   run an experiment (same as python experiments/x.py)
  rlhf plan experiments/x.py [--config CMD ...]   print each stage's execution plan
  rlhf show experiments/x.py [--config CMD ...]   print the graph after overrides
  rlhf data prepare TASK --out DIR                write a dataset in verl's schema
"""


def load_experiment(path: str):
    file = Path(path)
    if not file.is_file():
        sys.exit(f"error: no experiment file {path!r} (e.g. experiments/arithmetic_tiny.py)")
    sys.path.insert(0, str(file.resolve().parent.parent))  # the project root, for rlhf_configs
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[file.stem] = module
    spec.loader.exec_module(module)
    return module


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "data":
        if not rest or rest[0] != "prepare":
            sys.exit("usage: rlhf data prepare TASK --out DIR")
        from rlhf.data.prepare import main as prepare

        return prepare(rest[1:])
    if command in ("run", "plan", "show"):
        if not rest:
            sys.exit(f"usage: rlhf {command} experiments/x.py [--config CMD ...]")
        from rlhf.config.cli import run_cli

        extra = {"plan": ["--print_plan"], "show": ["--print_graph"], "run": []}[command]
        run_cli(load_experiment(rest[0]), rest[1:] + extra)
        return 0
    sys.exit(f"error: unknown command {command!r}\n\n{USAGE}")


if __name__ == "__main__":
    sys.exit(main())
