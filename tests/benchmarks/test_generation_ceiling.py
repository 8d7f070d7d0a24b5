"""benchmarks/generation_ceiling.py: a rollout's seconds split into decoding matmuls, prefill and the rest."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tiny_model_path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import generation_ceiling  # noqa: E402


def run(seconds: dict, gflop: float = 100.0, decode: float = 80.0, peak: float = 100.0) -> dict:
    seconds = {"attention": 0.0, **seconds}
    return {"seconds": {**seconds, "other": seconds["total"] - seconds["matmul"] - seconds["prefill"]
                        - seconds["attention"]},
            "gflop": gflop, "decode_matmul_gflop": decode, "matmul_peak_gflops": peak}


def test_summary_hand_computed():
    """100 GFLOP in 2 s at a peak of 100 GFLOP/s is 50%; the 80 GFLOP of decoding matmuls in 1 s are 80% of the
    peak; with no other work the rollout would take 1 + 0.25 s: 80%, with its attention too 1 + 0.25 + 0.25 s:
    66.7%; at 70% it may take 100/70 s in all."""
    s = generation_ceiling.summarise([run({"total": 2.0, "matmul": 1.0, "prefill": 0.25, "attention": 0.25}),
                                      run({"total": 4.0, "matmul": 2.0, "prefill": 0.5, "attention": 0.5}),
                                      run({"total": 1.0, "matmul": 1.0, "prefill": 0.0})])
    assert s["utilisation"] == 0.5 and s["utilisation_range"] == [0.25, 1.0]
    assert s["decode_matmuls_of_peak"] == 0.8 and s["decode_matmuls_of_peak_range"] == [0.4, 0.8]
    assert s["ceiling_without_other_work"] == 0.8 and s["ceiling_range"] == [0.4, 1.0]
    assert s["other_seconds_allowed_for_70_percent"] == pytest.approx(100 / 70 - 1.25, abs=1e-4)
    assert s["ceiling_with_attention"] == pytest.approx(0.6667, abs=1e-4)
    assert s["seconds"] == {"total": 2.0, "matmul": 1.0, "attention": 0.25, "prefill": 0.25, "other": 0.5}


def test_the_tiny_model_rollout_is_split_and_its_flops_counted(tmp_path):
    """Through the lean decoder on the tiny Qwen2 model: the matmuls and the prefill were really timed (each > 0,
    together below the total), and the FLOPs are bench_flops' count of that rollout."""
    from bench_flops import Shape, rollout_flops
    from transformers import AutoConfig

    out = tmp_path / "c.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "generation_ceiling.py"), "--model", tiny_model_path(),
                    "--prompts", "2", "--n", "2", "--prompt-tokens", "5", "--new-tokens", "6", "--repeats", "2",
                    "--out", str(out)], check=True, cwd=ROOT, timeout=600)
    workload = json.loads(out.read_text())["workloads"]["2x2/p5/6tok"]
    assert len(workload["runs"]) == 2
    shape = Shape.of(AutoConfig.from_pretrained(tiny_model_path()))
    for r in workload["runs"]:
        s = r["seconds"]
        assert s["matmul"] > 0 and s["attention"] > 0 and s["prefill"] > 0
        assert s["matmul"] + s["attention"] + s["prefill"] < s["total"]
        assert r["gflop"] == pytest.approx(rollout_flops(shape, [5, 5], 2, [6] * 4) / 1e9)
        assert r["decode_matmul_gflop"] == pytest.approx(4 * 5 * 2 * (shape.body + shape.head) / 1e9)
    summary = workload["summary"]
    assert 0 < summary["utilisation"] < summary["ceiling_with_attention"] < summary["ceiling_without_other_work"]
