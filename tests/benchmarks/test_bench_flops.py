"""The FLOP counts behind the utilisation tables: hand-computed values, and the parameter count of a real model."""

import sys
from pathlib import Path

import pytest
import torch
from helpers import tiny_model_path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_flops import Shape, forward_flops, rollout_flops, update_flops  # noqa: E402

SMALL = Shape(layers=1, hidden=2, attention_width=2, kv_width=1, intermediate=3, vocab=5)


def test_hand_computed_counts():
    assert SMALL.body == 2 * (2 + 2 * 1) + 2 * 2 + 3 * 2 * 3 == 30 and SMALL.head == 10
    assert SMALL.attention(2) == 4 * 1 * 2 * 3  # query 1 sees 1 key, query 2 sees 2
    assert SMALL.attention(1, keys_before=4) == 4 * 1 * 2 * 5
    assert forward_flops(SMALL, 1, 1, rows=1) == 2 * 30 * 2 + 2 * 10 * 1 + 24
    assert forward_flops(SMALL, 1, 1, rows=3) == 3 * 164
    # two rows sharing a 1-token prompt: the prompt once (2 * 30 + 4 * 2 * 1), each response token after it
    assert forward_flops(SMALL, 1, 1, rows=2, n=2) == (60 + 8) + 2 * (60 + 20 + 4 * 2 * 2)
    assert forward_flops(SMALL, 3, 2, rows=1) == 2 * 30 * 5 + 2 * 10 * 2 + SMALL.attention(5)
    assert update_flops(SMALL, 1, 1, rows=1) == 3 * 164
    # prefill of one 1-token prompt (head on its last token), then one decode step attending to 3 keys
    assert rollout_flops(SMALL, [1], 1, [2]) == (60 + 20 + 8) + (60 + 20 + 4 * 2 * 3)
    # n = 2: the prompt is prefilled once for both responses
    assert rollout_flops(SMALL, [1], 2, [1, 1]) == 88


def test_body_and_head_are_the_models_matmul_parameters():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path())
    shape = Shape.of(model.config)
    linear = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    assert shape.body == linear
    assert shape.head == model.get_output_embeddings().weight.numel()


def test_grpo_vs_trl_utilisation_divides_each_phase_by_its_own_seconds():
    from bench_workloads import Workload
    from grpo_vs_trl import utilisation, utilisation_table

    w = Workload("small", 2, 0.0, full_length=True, prompts=1, samples=2)
    runs = [{"ok": True, "workload": w.name, "framework": "local",
             "per_step": [{"prompt_length_mean": 1.0, "gen_tokens": 4.0}]}]
    summary = {w.name: {
        "local": {"phases": {"generate": 2.0, "log_probs_ref": 1.0, "of_which_forward_backward": 4.0}},
        "trl": {"phases": {"generate": 1.0, "log_probs_ref": 2.0, "forward": 1.0, "backward": 3.0}},
    }}
    util = utilisation(summary, runs, [w], SMALL, peak_gflops=1e-9)  # 1 FLOP/s: utilisation = FLOPs / seconds
    gen = rollout_flops(SMALL, [1], 2, [2, 2])
    fwd, upd = forward_flops(SMALL, 1, 2, rows=2, n=2), update_flops(SMALL, 1, 2, rows=2, n=2)
    assert util[w.name]["frameworks"]["local"] == pytest.approx({"generate": gen / 2.0, "log_probs_ref": fwd / 1.0, "update": upd / 4.0})
    assert util[w.name]["frameworks"]["trl"] == pytest.approx({"generate": gen / 1.0, "log_probs_ref": fwd / 2.0, "update": upd / 4.0})
    assert (util[w.name]["prompt_tokens"], util[w.name]["response_tokens"]) == (1, 2)
    rows = [line for line in utilisation_table(util).splitlines() if line.startswith(f"| {w.name} |")]
    assert [line.split(" | ")[1] for line in rows] == ["local", "trl"]  # one row per framework, nothing else
