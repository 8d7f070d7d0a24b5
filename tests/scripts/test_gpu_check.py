"""scripts/gpu_check.sh and the pieces it relies on, checked where there is no GPU: it refuses at once (never
hangs), the benchmarks it calls keep partial results and bound each child, and the library imports without
Ray and Aim (the GPU image has neither)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no CUDA device is visible")
def test_gpu_check_without_a_gpu_fails_at_once_with_the_reason(tmp_path):
    started = time.monotonic()
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 2
    assert "no CUDA device visible" in done.stderr and "run this on a GPU machine" in done.stderr
    assert time.monotonic() - started < 30
    assert not (tmp_path / "out" / "logs" / "steps.jsonl").exists()  # no step started


def test_memory_plan_grid_on_one_gpu_is_single_rank_and_includes_the_real_shape():
    import memory_plan

    points = memory_plan.grid(["tiny"], quick=False, device="cuda")
    assert {p["ranks"] for p in points} == {1} and {p["device"] for p in points} == {"cuda"}
    big = [p for p in points if p["model"] == "qwen0.5b"]
    assert {(p["strategy"], p["checkpointing"]) for p in big} == {("ddp", False), ("ddp", True), ("fsdp", False),
                                                                  ("fsdp", True)}
    assert all(p["dtype"] == "bfloat16" for p in big)
    assert all("device" not in p for p in memory_plan.grid(["tiny"], quick=True))  # the CPU grid is unchanged


def test_gpu_step_child_that_outlasts_its_limit_is_reported_not_waited_for(tmp_path):
    import gpu_step

    started = time.monotonic()
    result = gpu_step.run_child("rlhf", "tiny", 1, str(tmp_path), timeout_s=0.5)
    assert result["error"][0] == "timed out after 0 s" or result["error"][0].startswith("timed out after")
    assert time.monotonic() - started < 20


def test_experiments_run_in_process_without_ray_and_aim_installed(tmp_path):
    """What the GPU image has: no Ray, no Aim. The recipe still builds and runs on LocalRuntime without
    tracking; asking for RayRuntime or AimTracker there says what is missing and what to do."""
    code = f"""
import sys
sys.modules["ray"] = sys.modules["aim"] = sys.modules["aimrocks"] = None  # import fails as if absent
sys.path.insert(0, {str(ROOT)!r})
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.tracking.aim_tracker import AimTracker
for build in (lambda: RayRuntime()._init(None), lambda: AimTracker(repo={str(tmp_path / "aim")!r})):
    try:
        build()
    except ImportError as err:
        print("refused:", err)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    assert "RayRuntime needs Ray" in lines[0] and "fiddler:local" in lines[0]
    assert "AimTracker needs Aim" in lines[1] and "fiddler:no_tracking" in lines[1]
