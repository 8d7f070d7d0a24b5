"""The command line: the `rlhf` command (`main`) and an experiment file's own (`python experiments/x.py`).

`COMMANDS` is the one list of `rlhf` commands: each names its function as "module:function", imported
only when the command runs (so `rlhf serve` starts no Ray or Aim, and `rlhf --help` imports nothing
heavy), and the forms `rlhf --help` prints. Most commands' flags are parsed in this package; two
parse their own, beside what they run: `rlhf serve` (`rlhf.serve.server`) and `rlhf data prepare`
(`rlhf.data.prepare`). Modules:

- here, `main`: `rlhf COMMAND ...` through argparse subparsers built from `COMMANDS`.
- `experiment`: `run_cli` (`python experiments/x.py --config ...`), `load_experiment` (an experiment
  file as a module), `build_graph`, `format_results`; `experiment_commands`: `rlhf run|plan|show`.
- `diff`, `viz`, `rerun`, `ui`: `rlhf diff|viz|rerun|ui` (what differs between graphs, the stage
  pictures, a stored run's graph run again, Aim's UI).
- `export`: `rlhf export` (a stage, checkpoint or adapter -> a model folder).
- `sft`: `rlhf sft`; `dpo`: `rlhf dpo`; `rm`: `rlhf rm` (a reward model on preference pairs); `generate_eval`:
  `rlhf generate`, `rlhf eval` and `rlhf probe` (their checks before
  a model loads: `job_inputs`). Their flags' defaults are the graph builders', read from the builders'
  source (`source_defaults`), so `--help` imports neither torch nor the runtimes; `graph_flags`: the knob
  flags of `sft|generate|eval|probe` as aliases of `set:` overrides on the shipped graph.
- `rollouts`: `rlhf rollouts show|view`; `data`: `rlhf data prepare` (`prepare_preferences`: its `preferences`
  task, which samples a model).
- `signals`: Ctrl-C and SIGTERM for processes started with SIGINT ignored.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlhf.cli.errors import one_line_errors
from rlhf.cli.signals import honour_interrupts

__all__ = ["COMMANDS", "Command", "command_parser", "main"]


@dataclass(frozen=True)
class Command:
    """One `rlhf` command: its function and what `rlhf --help` says of it."""

    target: str  # "module:function"; the function takes the arguments after the command's name, returns the status
    forms: tuple[tuple[str, str], ...]  # (arguments, what the command does with them), one per way to call it
    after_error: str | None = None  # said after a one-line error (e.g. how to resume)

    def function(self) -> Callable[[list[str]], int]:
        """The command's function, its module imported now."""
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)

    def help(self) -> str:
        """The forms as aligned lines: `rlhf --help` keeps their line breaks."""
        return "\n".join(f"{arguments:<38} {what}" for arguments, what in self.forms)


EXPERIMENT = "experiments/x.py [--config CMD ...]"
COMMANDS: dict[str, Command] = {
    "run": Command("rlhf.cli.experiment_commands:run_main",
                   ((EXPERIMENT, "run an experiment (same as python experiments/x.py)"),)),
    "plan": Command("rlhf.cli.experiment_commands:plan_main",
                    ((EXPERIMENT, "print each stage's execution plan (and its memory per device)"),
                     ("--memory CONFIG [--gpus 8 ...]", "what fits on N GPUs for a model config.json alone"))),
    "show": Command("rlhf.cli.experiment_commands:show_main",
                    ((EXPERIMENT, "print the graph after overrides, and where each value was set"),)),
    "diff": Command("rlhf.cli.diff:diff_main",
                    (("A B [--config CMD ...]", "what differs between two experiments, JSON graphs or Aim runs"),)),
    "viz": Command("rlhf.cli.viz:viz_main",
                   (("experiments/x.py --out DIR", "each stage graph as SVG (Graphviz) and the Plan as text"),)),
    "rerun": Command("rlhf.cli.rerun:rerun_main",
                     (("RUN_HASH [--repo .aim] [--local]", "run the graph an Aim run stored again"),)),
    "ui": Command("rlhf.cli.ui:ui_main",
                  (("[--repo .aim] [--port N]", "Aim's UI on loopback, with a link to the latest sweep"),)),
    "data": Command("rlhf.cli.data:data_main", (("prepare TASK --out DIR", "write a dataset in verl's schema"),
                                                ("prepare preferences --model M ...",
                                                 "preference pairs from a model's samples ranked by a scorer"))),
    "sft": Command("rlhf.cli.sft:sft_main",
                   (("MODEL --data FILE [--lora-rank 16]",
                     "supervised fine-tuning of a model folder (LoRA with --lora-rank)"),)),
    "dpo": Command("rlhf.cli.dpo:dpo_main",
                   (("MODEL --data PAIRS [--loss sigmoid|ipo|...]",
                     "learn from preference pairs: DPO, robust DPO, IPO, SimPO, RPO"),)),
    "rm": Command("rlhf.cli.rm:rm_main",
                  (("MODEL --data PAIRS [--val PAIRS]",
                    "train a reward model on preference pairs (Bradley-Terry)"),)),
    "export": Command("rlhf.cli.export:export_main",
                      (("SOURCE OUT [--step N]", "a stage, checkpoint (LoRA too) or adapter -> model folder"),)),
    "models": Command("rlhf.cli.models:models_main",
                      (("import SOURCE OUT", "a .gguf file, model folder or known name -> fp32 model folder"),
                       ("check-template MODEL", "is the chat template append-only for multi-turn tool rollouts?"))),
    "rollouts": Command("rlhf.cli.rollouts:rollouts_main",
                        (("show STAGE_DIR [--step N]", "print recorded rollouts (best/worst per group)"),
                         ("view STAGE_DIR", "browse them: steps, groups ranked, search, masked spans"))),
    "generate": Command("rlhf.cli.generate_eval:generate_main",
                        (("MODEL --data FILE --out FILE", "n responses per prompt (resumable JSON Lines + parquet)"),),
                        after_error="run the same command again to continue where it stopped"),
    "eval": Command("rlhf.cli.generate_eval:eval_main",
                    (("--generations FILE [--ks 1,2,4,8]", "score generations: mean@n, pass@k, maj@k per data source"),
                     ("MODEL --data FILE --n 8 [--out DIR]", "generate, then score"))),
    "probe": Command("rlhf.cli.generate_eval:probe_main",
                     (("MODEL --data FILE [--limit 64]",
                       "before training: greedy accuracy, answer lengths, what budgets cut"),)),
    "serve": Command("rlhf.serve:main",
                     (("MODEL [--port 8000 --api-key KEY]", "an OpenAI-compatible server (completions, chat)"),)),
    "doctor": Command("rlhf.cli.doctor:doctor_main",
                      (("[--json]", "versions, devices and what `auto` picks here, for bug reports"),)),
}


def command_parser() -> argparse.ArgumentParser:
    """`rlhf COMMAND ...`: a subparser per command of `COMMANDS`, each passing every argument after the
    command's name (`--help` included) on to the command's own parser."""
    parser = argparse.ArgumentParser(
        prog="rlhf", usage="rlhf COMMAND ...", epilog="`rlhf COMMAND --help` describes a command's options.",
        formatter_class=lambda prog: argparse.RawTextHelpFormatter(prog, max_help_position=14, width=140))
    commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    for name, command in COMMANDS.items():
        # no prefix characters: `--help` and every flag are the command's arguments, not this parser's
        sub = commands.add_parser(name, help=command.help(), add_help=False, prefix_chars="\0")
        sub.add_argument("arguments", nargs=argparse.REMAINDER)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`rlhf COMMAND ...` (the console script); `argv` defaults to `sys.argv[1:]`. An error the command can
    explain, a full disk and Ctrl-C end it with one line, not a traceback (`rlhf.cli.errors`)."""
    honour_interrupts()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = command_parser()
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    if argv[0] not in COMMANDS:
        sys.exit(f"error: unknown command {argv[0]!r}\n\n{parser.format_help()}")
    args = parser.parse_args(argv)
    command = COMMANDS[args.command]
    with one_line_errors(command.after_error):
        return command.function()(args.arguments)
