"""The command line: the `rlhf` command (`main`) and an experiment file's own (`python experiments/x.py`).

Nothing below this package parses arguments, prints results or loads experiment files. Modules:

- here, `main`: `rlhf COMMAND ...`; each command's module is imported when the command runs, so
  `rlhf serve` does not start up Ray or Aim.
- `experiment`: `run_cli` (`python experiments/x.py --config ...`, `rlhf run|plan|show`),
  `load_experiment` (an experiment file as a module), `build_graph`, `format_results`.
- `diff`, `viz`, `rerun`, `ui`: `rlhf diff|viz|rerun|ui` (what differs between graphs, the stage
  pictures, a stored run's graph run again, Aim's UI).
- `export`: `rlhf export` (a stage, checkpoint or adapter -> a model folder).
- `generate_eval`: `rlhf generate`, `rlhf eval` and `rlhf probe`.
- `signals`: Ctrl-C and SIGTERM for processes started with SIGINT ignored.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rlhf.cli.errors import one_line_errors
from rlhf.cli.signals import honour_interrupts

USAGE = """usage: rlhf COMMAND ...

  rlhf run  experiments/x.py [--config CMD ...]   run an experiment (same as python experiments/x.py)
  rlhf plan experiments/x.py [--config CMD ...]   print each stage's execution plan (and its memory per device)
  rlhf plan --memory CONFIG [--gpus 8 ...]        what fits on N GPUs for a model config.json alone
  rlhf show experiments/x.py [--config CMD ...]   print the graph after overrides, and where each value was set
  rlhf diff A B [--config CMD ...]                what differs between two experiments, JSON graphs or Aim runs
  rlhf viz  experiments/x.py --out DIR            each stage graph as SVG (Graphviz) and the Plan as text
  rlhf rerun RUN_HASH [--repo .aim] [--local]     run the graph an Aim run stored again
  rlhf ui [--repo .aim] [--port N]                Aim's UI on loopback, with a link to the latest sweep
  rlhf data prepare TASK --out DIR                write a dataset in verl's schema
  rlhf sft MODEL --data FILE [--lora-rank 16]     supervised fine-tuning of a model folder (LoRA with --lora-rank)
  rlhf export SOURCE OUT [--step N]               a stage, checkpoint (LoRA too) or adapter -> model folder
  rlhf models import SOURCE OUT                   a .gguf file, model folder or known name -> fp32 model folder
  rlhf models check-template MODEL                is the chat template append-only for multi-turn tool rollouts?
  rlhf rollouts show STAGE_DIR [--step N]         print recorded rollouts (best/worst per group)
  rlhf rollouts view STAGE_DIR                    browse them: steps, groups ranked, search, masked spans
  rlhf generate MODEL --data FILE --out FILE      n responses per prompt (resumable JSON Lines + parquet)
  rlhf eval --generations FILE [--ks 1,2,4,8]     score generations: mean@n, pass@k, maj@k per data source
  rlhf eval MODEL --data FILE --n 8 [--out DIR]   generate, then score
  rlhf probe MODEL --data FILE [--limit 64]      before training: greedy accuracy, answer lengths, what budgets cut
  rlhf serve MODEL [--port 8000 --api-key KEY]    an OpenAI-compatible server (completions, chat)
  rlhf doctor [--json]                            versions, devices and what `auto` picks here, for bug reports

`rlhf COMMAND --help` describes a command's options.
"""


def main(argv: Sequence[str] | None = None) -> int:
    """`rlhf COMMAND ...` (the console script); `argv` defaults to `sys.argv[1:]`. An error the command can
    explain, a full disk and Ctrl-C end it with one line, not a traceback (`rlhf.cli.errors`)."""
    honour_interrupts()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    resume = "run the same command again to continue where it stopped" if argv[0] == "generate" else None
    with one_line_errors(resume):
        return _command(argv[0], argv[1:])


def _command(command: str, rest: list[str]) -> int:
    if command == "serve":  # rlhf serve MODEL [--host --port --api-key ...]: an OpenAI-compatible server
        from rlhf.serve import main as serve

        return serve(rest)
    if command == "data":
        if not rest or rest[0] != "prepare":
            print("usage: rlhf data prepare TASK --out DIR   (`rlhf data prepare --help`: the tasks and options)")
            return 0 if rest and rest[0] in ("-h", "--help") else 2
        from rlhf.data.prepare import main as prepare

        return prepare(rest[1:])
    if command == "export":
        from rlhf.cli.export import export_main

        return export_main(rest)
    if command == "doctor":
        from rlhf.cli.doctor import doctor_main

        return doctor_main(rest)
    if command == "models":
        from rlhf.cli.models import models_main

        return models_main(rest)
    if command == "rollouts":
        from rlhf.trainers.records import format_records, read_records

        p = argparse.ArgumentParser(prog="rlhf rollouts", description="Recorded rollouts of an RL stage: "
                                    "`show` prints best/worst per group, `view` browses them in the terminal.")
        p.add_argument("action", choices=["show", "view"])
        p.add_argument("stage_dir", help="a stage folder: <output_dir>/<experiment>/<run>/<stage>")
        p.add_argument("--step", type=int, default=None, help="show: only this step")
        a = p.parse_args(rest)
        try:
            if a.action == "view":
                from rlhf.cli.rollouts_view import view

                view(a.stage_dir)
            else:
                print(format_records(read_records(a.stage_dir, a.step)))
        except FileNotFoundError as err:
            sys.exit(f"error: {err}")
        return 0
    if command == "plan" and rest and rest[0] == "--memory":
        from rlhf.cli.memory_plan import memory_plan_main

        return memory_plan_main(rest[1:])
    if command in ("run", "plan", "show"):
        if not rest or rest[0] in ("-h", "--help"):
            usage = {"run": "run an experiment (the file's own flags: python experiments/x.py --help)",
                     "plan": "print each stage's execution plan and its memory per device; "
                             "`rlhf plan --memory --help` for a model config alone",
                     "show": "print the graph after overrides, and where each value was set"}[command]
            print(f"usage: rlhf {command} experiments/x.py [--config CMD ...]\n\n  {usage}")
            return 0 if rest else 2
        from rlhf.cli.experiment import load_experiment, run_cli

        extra = {"plan": ["--print_plan"], "show": ["--print_graph"], "run": []}[command]
        run_cli(load_experiment(rest[0]), rest[1:] + extra)
        return 0
    if command == "diff":
        from rlhf.cli.diff import diff_main

        return diff_main(rest)
    if command == "viz":
        from rlhf.cli.viz import viz_main

        return viz_main(rest)
    if command == "rerun":
        from rlhf.cli.rerun import rerun_main

        return rerun_main(rest)
    if command == "ui":
        from rlhf.cli.ui import ui_main

        return ui_main(rest)
    if command == "sft":  # rlhf sft MODEL --data FILE [--val FILE --steps --batch-size --lr --out --local]
        from rlhf_configs.sft import main as sft

        return sft(rest)
    if command in ("generate", "eval", "probe"):
        from rlhf.cli.generate_eval import eval_main, generate_main, probe_main

        return {"generate": generate_main, "eval": eval_main, "probe": probe_main}[command](rest)
    sys.exit(f"error: unknown command {command!r}\n\n{USAGE}")

