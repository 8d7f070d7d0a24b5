"""benchmarks/preference_vs_trl.py: the pairs, the per-repetition ratios, and a `--quick` run against TRL 1.16."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_peer  # noqa: E402
import preference_vs_trl  # noqa: E402
from bench_preference import pair_rows  # noqa: E402


def test_pairs_are_deterministic_conversational_and_differ_within_a_pair():
    rows = pair_rows(6, answer_words=12, seed=3)
    assert rows == pair_rows(6, answer_words=12, seed=3)
    assert rows != pair_rows(6, answer_words=12, seed=4)
    for row in rows:
        assert row["prompt"][0]["role"] == "user"
        chosen, rejected = row["chosen"][0]["content"], row["rejected"][0]["content"]
        assert chosen != rejected and row["chosen"][0]["role"] == row["rejected"][0]["role"] == "assistant"
        assert 9 <= len(chosen.split()) <= 15 + 16  # 12 words +-25%, then up to one whole sentence more


def test_ratio_spread_hand_computed():
    assert bench_peer.ratio_spread([1.5, 2.0, 1.0]) == {
        "speedup_per_rep": [1.5, 2.0, 1.0], "speedup_median": 1.5, "speedup_range": [1.0, 2.0]}
    assert bench_peer.ratio_spread([], "cpu") == {}


def _run(framework, rep, step_s, cpu_s, rss):
    return {"ok": True, "task": "dpo", "framework": framework, "rep": rep, "peak_rss_mib": rss, "setup_s": 1.0,
            "setup_phases_s": {}, "peak_rss_by_phase_mib": {"setup": rss / 2, "steps": rss, "after": rss},
            "per_step": [{"step_s": 9.0, "cpu_s": 9.0}] + [{"step_s": s, "cpu_s": cpu_s, "phase_s/forward": s / 2}
                                                          for s in step_s]}


def test_summary_ratios_pair_the_runs_of_one_repetition():
    runs = [_run("ours", 0, [1.0, 1.0], 0.5, 100), _run("trl", 0, [3.0, 3.0], 1.0, 150),
            _run("trl", 1, [2.0, 2.0], 2.0, 200), _run("ours", 1, [2.0, 2.0], 1.0, 100)]
    row = preference_vs_trl.summarise(runs, ["dpo"], ["ours", "trl"], discard=1)["dpo"]
    assert row["trl"]["speedup_per_rep"] == [3.0, 1.0]  # rep 0: 3/1, rep 1: 2/2 (the warm-up step left out)
    assert row["trl"]["cpu_speedup_per_rep"] == [2.0, 2.0]
    assert row["trl"]["rss_steps_ratio_per_rep"] == [1.5, 2.0]
    assert row["ours"]["phases"] == {"forward": 0.75, "other": 0.75}  # medians over the two runs' medians
    assert "speedup_median" not in row["ours"]


@pytest.mark.slow
def test_quick_run_against_trl(tmp_path):
    if reason := bench_peer.trl_missing_reason():
        pytest.skip(reason)
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "preference_vs_trl.py"), "--quick", "--out",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["complete"] and all(run["ok"] for run in result["runs"])
    for task in ("rm", "dpo"):
        ours, trl = result["summary"][task]["ours"], result["summary"][task]["trl"]
        assert trl["speedup_median"] > 0 and trl["rss_steps_ratio_median"] > 0
        for side in (ours, trl):
            assert side["phases"]["forward"] > 0 and side["phases"]["backward"] > 0 and side["phases"]["optimizer"] > 0
            assert side["peak_rss_steps_mib"] > 100
        # the same pairs on both sides: every conversation's tokens, TRL keeping the template's newline after the
        # end-of-turn token (ours ends at the token the score is read at)
        tokens = {r["framework"]: sum(s["tokens"] for s in r["per_step"]) for r in result["runs"] if r["task"] == task}
        pairs = result["args"]["pairs_per_step"] * result["args"]["steps"]
        assert tokens["trl"] - tokens["ours"] == 2 * pairs
    dpo_ours = next(r for r in result["runs"] if r["task"] == "dpo" and r["framework"] == "ours")
    assert dpo_ours["setup_phases_s"]["reference_pass"] > 0  # computed once, before the steps
    assert "phase_s/forward_no_grad" not in dpo_ours["per_step"][-1]  # and never again in a step
