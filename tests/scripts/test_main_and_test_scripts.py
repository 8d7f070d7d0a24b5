"""`scripts/main.sh` runs with the thread and offline settings `scripts/test.sh` gives the tests: a figure
measured by the main job and one checked by a test come from the same settings."""

import os
import shutil
import subprocess
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
SETTINGS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE")


def environment_seen_by_python(script: str, tmp_path: Path) -> dict[str, str]:
    """What the `python` a script execs finds in its environment (the script run in a copy of the project
    whose env.sh does nothing and whose `python` prints the settings)."""
    root = tmp_path / script
    (root / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPTS / script, root / "scripts" / script)
    (root / "scripts" / "env.sh").write_text("")
    (root / "bin").mkdir()
    fake = root / "bin" / "python"
    fake.write_text("#!/bin/sh\n" + "".join(f'echo "{k}=${k}"\n' for k in SETTINGS))
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    env["PATH"] = f"{root / 'bin'}:{env['PATH']}"
    out = subprocess.run(["bash", str(root / "scripts" / script)], env=env, capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_main_job_runs_with_the_tests_thread_settings(tmp_path):
    tests = environment_seen_by_python("test.sh", tmp_path)
    assert tests["OMP_NUM_THREADS"] == "1"
    assert environment_seen_by_python("main.sh", tmp_path) == tests
