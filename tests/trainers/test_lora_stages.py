"""LoRA through whole stages: GRPO with `fiddler:lora` (reference = the adapter-disabled base) writes
adapter-only checkpoints that `rlhf export --step N` merges; `rlhf sft --lora-rank` trains an adapter;
the plan of a recipe with the fiddler shows no second reference model."""

import json

import fiddle as fdl
import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from helpers import tiny_model_path
from rlhf.algos import KLLoss, PPOClipLoss, kl_k3
from rlhf.cli import main
from rlhf.data.files import write_rows
from rlhf.data.generators import arithmetic_rows
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.rewards.manager import RewardManager
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment, run_experiment
from rlhf.runtime.local import LocalRuntime
from rlhf.trainers.rl import RLTrainer
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.policy import SHARED_REFERENCE
from rlhf.workers.training import TrainingSetup
from rlhf_configs.common import lora
from rlhf_configs.pieces import policy_group

pytest.importorskip("peft")


def digit_count_score(solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """Rewards that differ within a group on the untrained tiny model (so GRPO's advantages are not all 0)."""
    return float(sum(c.isdigit() for c in solution_str))


def grpo(tmp_path, **trainer):
    model = tiny_model_path()
    tok = fdl.Config(load_tokenizer, model)
    objective = fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss),
                           kl_loss=fdl.Config(KLLoss, estimator=kl_k3, coef=0.1))
    stage = fdl.Config(
        RLTrainer,
        policy=policy_group(model_path=model, ref_model_path=model, objective=objective,
                            optimizer=fdl.Partial(torch.optim.AdamW, lr=1e-2),
                            training=fdl.Config(TrainingSetup, micro_batch_size=8)),
        tokenizer=tok,
        train_data=fdl.Config(PromptDataset, rows=fdl.Config(arithmetic_rows, n=16), tokenizer=tok),
        reward=fdl.Config(RewardManager, scorers={"arithmetic": digit_count_score}),
        sampling=fdl.Config(SamplingParams, n=4, max_new_tokens=4),
        prompts_per_step=4,
        **trainer,
    )
    return fdl.Config(Experiment, name="lora", stages={"grpo": stage}, runtime=fdl.Config(LocalRuntime),
                      output_dir=str(tmp_path), progress=False, run_name="r")


def same(a: dict, b: dict, atol=0.0) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=atol, rtol=0) for k in a)


def test_grpo_with_the_lora_fiddler_writes_adapter_checkpoints_that_export_merged(tmp_path, capsys):
    graph = grpo(tmp_path, total_steps=4, save_freq=2)
    lora(graph, rank=4, alpha=8)
    result = run_experiment(graph)["grpo"]
    assert SHARED_REFERENCE in capsys.readouterr().out  # no second model was loaded for the KL term
    stage = tmp_path / "lora" / "r" / "grpo"
    final = load_causal_lm(result["checkpoint"]).state_dict()
    assert not same(final, load_causal_lm(tiny_model_path()).state_dict())  # the adapter learned
    adapter_config = json.loads((stage / "final-adapter" / "adapter_config.json").read_text())
    assert (adapter_config["r"], adapter_config["lora_alpha"]) == (4, 8)

    for step in (2, 4):
        metadata = FileSystemReader(str(stage / "checkpoints" / f"step_{step:08d}" / "policy" / "dcp")).read_metadata()
        saved = [k for k in metadata.state_dict_metadata if k.startswith("model.")]
        assert saved and all("lora_" in k for k in saved), saved  # the frozen base is not written
        assert main(["export", str(stage), str(tmp_path / f"step{step}"), "--step", str(step)]) == 0
    assert same(load_causal_lm(str(tmp_path / "step4")).state_dict(), final, atol=1e-6)  # the last step is final
    assert not same(load_causal_lm(str(tmp_path / "step2")).state_dict(), final, atol=1e-6)


def test_rlhf_sft_with_lora_rank_trains_an_adapter(tmp_path, capsys):
    write_rows(arithmetic_rows(8), tmp_path / "train.jsonl")
    code = main(["sft", tiny_model_path(), "--data", str(tmp_path / "train.jsonl"), "--steps", "3",
                 "--batch-size", "4", "--lr", "1e-2", "--lora-rank", "4", "--lora-alpha", "8",
                 "--out", str(tmp_path / "out"), "--local", "--quiet"])
    assert code == 0
    checkpoint = capsys.readouterr().out.split("checkpoint: ")[1].split()[0]
    config = json.loads(open(f"{checkpoint}-adapter/adapter_config.json").read())
    assert (config["r"], config["lora_alpha"]) == (4, 8)
    trained = load_causal_lm(checkpoint).state_dict()
    assert not same(trained, load_causal_lm(tiny_model_path()).state_dict())
    assert same(load_causal_lm(f"{checkpoint}-adapter").state_dict(), trained, atol=1e-6)
    with pytest.raises(SystemExit):
        main(["sft", tiny_model_path(), "--data", str(tmp_path / "train.jsonl"), "--lora-alpha", "8"])


def test_the_lora_fiddler_on_a_recipe_adapts_trained_policies_and_shares_their_reference(capsys):
    assert main(["plan", "experiments/arithmetic_tiny.py", "--config", "fiddler:lora(rank=4)"]) == 0
    out = capsys.readouterr().out
    assert SHARED_REFERENCE in out  # the GRPO stage: reference = the SFT model it starts from
    with pytest.raises(SystemExit, match="rnk"):
        main(["plan", "experiments/arithmetic_tiny.py", "--config", "fiddler:lora(rnk=4)"])
