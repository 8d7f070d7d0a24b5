"""SFT graph pieces: one SFT stage over data files, and the graph of `rlhf sft` (its flags: `rlhf.cli.sft`).

Rows are verl prompt rows (the response is the ground truth, or `extra_info[--response-key]`)
or chat rows with `messages` (the loss covers the assistant turns). The final checkpoint is
`<out>/sft/<time>/sft/final`, a Hugging Face folder an RL stage can start from (with `--lora-rank`,
the merged model; the adapter alone is `final-adapter`).
"""

from __future__ import annotations

import fiddle as fdl
import torch
from transformers import get_cosine_schedule_with_warmup

from rlhf.data.prompts import PromptDataset
from rlhf.data.sft import SFTDataset, answer_from_extra_info, answer_from_ground_truth, load_sft_rows
from rlhf.models.loading import load_tokenizer
from rlhf.rewards import RewardManager, default_scorers
from rlhf.rollout.sampling import SamplingParams
from rlhf.runtime.experiment import Experiment
from rlhf.trainers.evaluate import Evaluator
from rlhf.trainers.sft import SFTTrainer
from rlhf.workers.objectives import SFTObjective
from rlhf.workers.training import TrainingSetup
from rlhf_configs.pieces import one_stage_experiment, policy_group


def sft_stage(
    model, data, val=None, *, steps: int = 500, batch_size: int = 64, micro_batch_size: int = 8, lr: float = 1e-5,
    warmup_steps: int = 10, max_length: int = 1024, response_key: str | None = None, accuracy: bool = False,
    max_new_tokens: int = 512, test_freq: int = 50, save_freq: int = 0, workers: int = 1, gpus_per_worker: float = 0,
    compute_dtype: str = "float32",
) -> fdl.Config[SFTTrainer]:
    """An SFT stage: AdamW + cosine schedule with warmup, gradient accumulation over micro-batches,
    length-bucketed batches, `val/sft_loss` on `val` and (accuracy=True) greedy exact match on it."""
    tokenizer = fdl.Config(load_tokenizer, model)
    response = answer_from_ground_truth
    if response_key is not None:
        response = fdl.Partial(answer_from_extra_info, key=response_key)

    def dataset(path, name):
        return fdl.Config(SFTDataset, rows=fdl.Config(load_sft_rows, path=path), tokenizer=tokenizer,
                          response=response, max_length=max_length, name=name)

    evaluator = None
    if val is not None and accuracy:  # needs prompt rows whose data_source has a scorer
        evaluator = fdl.Config(
            Evaluator,
            dataset=fdl.Config(PromptDataset, rows=fdl.Config(load_sft_rows, path=val), tokenizer=tokenizer,
                               name="val"),
            reward=fdl.Config(RewardManager, scorers=fdl.Config(default_scorers)),
            sampling=fdl.Config(SamplingParams, temperature=0.0, max_new_tokens=max_new_tokens),
        )
    return fdl.Config(
        SFTTrainer,
        policy=policy_group(
            num_workers=workers,
            gpus_per_worker=gpus_per_worker,
            model_path=model,
            objective=fdl.Config(SFTObjective),
            optimizer=fdl.Partial(torch.optim.AdamW, lr=lr, weight_decay=0.01),
            lr_scheduler=fdl.Partial(get_cosine_schedule_with_warmup, num_warmup_steps=warmup_steps,
                                     num_training_steps=steps),
            training=fdl.Config(TrainingSetup, micro_batch_size=micro_batch_size,
                                compute_dtype=compute_dtype),  # weights and AdamW state stay float32
        ),
        data=dataset(data, "train"),
        val_data=dataset(val, "val") if val is not None else None,
        evaluator=evaluator,
        batch_size=batch_size,
        total_steps=steps,
        test_freq=test_freq,
        save_freq=save_freq,
    )


def sft_experiment(
    model: str, data: str, val: str | None = None, out: str = "outputs", local: bool = False,
    aim_repo: str | None = None, progress: bool = True, **stage,
) -> fdl.Config[Experiment]:
    """`rlhf sft`: one SFT stage (keyword arguments go to `sft_stage`)."""
    return one_stage_experiment("sft", sft_stage(model, data, val, **stage), out=out, local=local,
                                aim_repo=aim_repo, progress=progress)
