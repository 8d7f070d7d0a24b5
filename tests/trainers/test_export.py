"""`rlhf export`: a checkpoint from 1 or 2 data-parallel workers becomes a model transformers loads
and generates from identically."""

import shutil

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
@pytest.mark.usefixtures("ray_cluster")
def test_export_from_two_ray_workers(tmp_path):
    runtime = RayRuntime(num_cpus=2)
    try:
        check_export(trained_group(runtime, 2), tmp_path)
    finally:
        runtime.shutdown()


def test_export_of_a_non_checkpoint_says_what_it_expects_in_one_line(tmp_path):
    with pytest.raises(SystemExit, match="error: .* holds nothing to export. Expected a stage folder"):
        main(["export", str(tmp_path), str(tmp_path / "out")])
    with pytest.raises(SystemExit, match="error: .*nope does not exist"):
        main(["export", str(tmp_path / "nope"), str(tmp_path / "out")])


def test_export_help_lists_its_options(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["export", "--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    for option in ("--step", "--base", "--dtype", "stage folder", "adapter"):
        assert option in out


def machine_local_values(folder) -> list[str]:
    """Keys or values in a model folder's JSON files that only make sense on this machine."""
    found = []
    for path in folder.glob("*.json"):
        text = path.read_text()
        found += [f"{path.name}: {key}" for key in ("local_files_only", "is_local", "name_or_path") if key in text]
        found += [f"{path.name}: {root}" for root in ("/tmp/", "/root/", "/home/", str(folder.parent)) if root in text]
    return found


def stage_folder(tmp_path, steps=(1, 2), final=True):
    """A stage folder as a trainer leaves it: checkpoints/step_* (a full policy state each) and final/."""
    from rlhf.trainers.checkpoint import CheckpointManager

    runtime = LocalRuntime()
    group = runtime.start_groups(group_plan(1))["policy"]
    stage = tmp_path / "stage"
    digests = {}
    for step in steps:
        group.update(scored_rollout(grpo_worker(), prompts=2, n=2, seed=step))
        CheckpointManager(stage / "checkpoints").save(step, lambda f: group.save_state(str(f / "policy")), {})
        digests[step] = group.parameters_digest()[0]
    group.update(scored_rollout(grpo_worker(), prompts=2, n=2, seed=9))
    if final:
        group.save(str(stage / "final"))
    digests["final"] = group.parameters_digest()[0]
    runtime.shutdown()
    return stage, digests


def test_a_stage_folder_exports_its_final_model_or_the_step_asked_for(tmp_path, capsys):
    stage, digests = stage_folder(tmp_path)
    assert main(["export", str(stage), str(tmp_path / "final")]) == 0
    assert "from " + str(stage / "final") in capsys.readouterr().out
    assert main(["export", str(stage), str(tmp_path / "one"), "--step", "1"]) == 0
    for name, want in (("final", digests["final"]), ("one", digests[1])):
        got = AutoModelForCausalLM.from_pretrained(tmp_path / name).state_dict()
        assert all(torch.equal(got[k], want[k]) for k in want), name
        assert machine_local_values(tmp_path / name) == []  # portable: no offline flags, no paths
    with pytest.raises(SystemExit, match="no checkpoint of step 7 .*step_00000001, step_00000002"):
        main(["export", str(stage), str(tmp_path / "x"), "--step", "7"])
    (stage / "final" / "model.safetensors").unlink()  # an unfinished stage: its newest checkpoint
    shutil.rmtree(stage / "final")
    assert main(["export", str(stage), str(tmp_path / "newest"), "--dtype", "bfloat16"]) == 0
    assert main(["export", str(stage / "checkpoints"), str(tmp_path / "newest-too")]) == 0
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "newest").state_dict()
    assert all(v.dtype == torch.bfloat16 for v in got.values())
    assert all(torch.equal(got[k], digests[2][k].to(torch.bfloat16)) for k in digests[2])


def test_a_stage_folder_with_only_final_exports_it(tmp_path):
    stage, digests = stage_folder(tmp_path, steps=())
    assert not (stage / "checkpoints").exists()
    assert main(["export", str(stage), str(tmp_path / "out")]) == 0
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    assert all(torch.equal(got[k], digests["final"][k]) for k in got)


def test_a_damaged_checkpoint_is_refused_in_one_line(tmp_path):
    stage, _ = stage_folder(tmp_path, steps=(1,), final=False)
    shard = next((stage / "checkpoints" / "step_00000001" / "policy" / "dcp").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(SystemExit, match="error: checkpoint .*step_00000001 is damaged: .*truncated"):
        main(["export", str(stage / "checkpoints" / "step_00000001"), str(tmp_path / "out")])
