"""`rlhf export`: a checkpoint from 1 or 2 data-parallel workers becomes a model transformers loads
and generates from identically."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhf.batch import Batch
from rlhf.cli import main
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.ray_runtime import RayRuntime
from helpers import group_plan, grpo_worker, scored_rollout


def trained_group(runtime, workers):
    group = runtime.start_groups(group_plan(workers))["policy"]
    group.update(scored_rollout(grpo_worker(), prompts=4, n=4))
    return group


def check_export(group, tmp_path):
    group.save_state(str(tmp_path / "ckpt" / "policy"))
    (expected,) = group.parameters_digest()[:1]
    assert main(["export", str(tmp_path / "ckpt"), str(tmp_path / "hf")]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    for k, v in model.state_dict().items():
        assert torch.equal(v, expected[k]), k
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tok.chat_template and tok.padding_side == "left"
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 12+34?"}], add_generation_prompt=True, tokenize=False)
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
    exported = model.generate(**ids, max_new_tokens=6, do_sample=False)[0, ids["input_ids"].shape[1]:]
    # the trained workers' own greedy response (their engine, their weights) is what the export must reproduce
    trained = group.generate(Batch({"input_ids": ids["input_ids"], "attention_mask": ids["attention_mask"]}),
                             SamplingParams(temperature=0.0, max_new_tokens=6))
    length = int(trained["response_mask"][0].sum())
    assert exported[:length].tolist() == trained["responses"][0, :length].tolist()


def test_export_from_one_worker(tmp_path):
    runtime = LocalRuntime()
    check_export(trained_group(runtime, 1), tmp_path)
    runtime.shutdown()


@pytest.mark.slow
def test_export_from_two_ray_workers(tmp_path):
    runtime = RayRuntime(num_cpus=2)
    try:
        check_export(trained_group(runtime, 2), tmp_path)
    finally:
        runtime.shutdown()


def test_export_of_a_non_checkpoint_says_what_it_expects(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a training checkpoint"):
        main(["export", str(tmp_path), str(tmp_path / "out")])
