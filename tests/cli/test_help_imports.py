"""`rlhf sft|dpo|generate|eval|probe|data prepare preferences --help` answer without importing torch, transformers, fiddle or the
runtimes (8-9 s of CPU before), and the defaults they show are the graph builders' own."""

import importlib
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf.cli.source_defaults import source_defaults

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "datasets", "fiddle", "ray", "aim", "rlhf.runtime", "rlhf_configs.sft",
         "rlhf_configs.generate_eval", "rlhf_configs.dpo", "rlhf_configs.reward_model")


@pytest.mark.parametrize("command", ["sft", "dpo", "rm", "generate", "eval", "probe", "data prepare preferences"])
def test_help_imports_nothing_heavy(command):
    code = (f"import sys\nfrom rlhf.cli import main\ntry:\n    main([*{command.split()!r}, '--help'])\nexcept SystemExit:\n"
            f"    pass\nprint('heavy:', sorted(m for m in {HEAVY!r} if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"usage: rlhf {command}" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "heavy: []"


# builder -> its defaults that are no literal (left out of the help: the command line does not set them)
BUILDERS = {("rlhf_configs.sft", "sft_stage"): set(),
            ("rlhf_configs.dpo", "dpo_stage"): set(),
            ("rlhf_configs.reward_model", "rm_stage"): set(),
            ("rlhf_configs.generate_eval", "generation_experiment"): set(),
            ("rlhf_configs.generate_eval", "eval_experiment"): set(),
            ("rlhf_configs.generate_eval", "probe_experiment"): set(),
            ("rlhf.workers.lora", "LoRA"): {"target_modules"}}


@pytest.mark.parametrize("module, name", sorted(BUILDERS))
def test_the_defaults_read_from_source_are_the_signatures(module, name):
    real = {k: p.default for k, p in inspect.signature(getattr(importlib.import_module(module), name)).parameters.items()
            if p.default is not inspect.Parameter.empty}
    read = source_defaults(module, name)
    assert read == {k: v for k, v in real.items() if k in read}
    assert set(real) - set(read) == BUILDERS[module, name]


def test_a_missing_function_is_named():
    with pytest.raises(LookupError, match="sft.py defines no function or class 'sft_stag'"):
        source_defaults("rlhf_configs.sft", "sft_stag")
