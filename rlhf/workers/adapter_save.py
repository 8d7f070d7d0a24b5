"""A policy trained through an adapter (LoRA), saved as two folders: the merged model and the adapter alone.

The merged folder is a plain Hugging Face model, so an RL stage starts from it unchanged; the adapter
folder (`<path>-adapter`, with the tokenizer; its config names the base model) is what `rlhf serve`,
`generate` and `export` also take. PEFT saves and merges a plain module: an FSDP-sharded actor is
first gathered into a whole copy on rank 0 (every rank takes part in the gather).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from rlhf.io.atomic import atomic_write_dir
from rlhf.models.saving import save_model_folder
from rlhf.workers.fsdp import is_sharded
from rlhf.workers.lora import merged, save_adapter, set_base_model
from rlhf.workers.state_io import unsharded_copy
from rlhf.workers.training import ModelTrainer

__all__ = ["save_merged_and_adapter"]


def save_merged_and_adapter(
    trainer: ModelTrainer, adapter: Callable[[torch.nn.Module], torch.nn.Module], base_model: str,
    tokenizer: PreTrainedTokenizerBase, path: str, auto_class: type = AutoModelForCausalLM,
) -> str:
    """Write `path` (the merged model) and `<path>-adapter` atomically on the main rank; every rank calls it.
    `auto_class`: the model's kind (a reward model's AutoModelForSequenceClassification)."""
    model = trainer.unwrapped()
    main = trainer.accelerator.is_main_process
    if is_sharded(model):  # gather a whole copy on rank 0
        trainer.accelerator.wait_for_everyone()
        state = trainer.full_state_dict()  # every rank takes part; rank 0 gets the weights
        config = model.get_base_model().config
        model = unsharded_copy(model, state, lambda: adapter(auto_class.from_config(config))) \
            if main else None
    if main:
        set_base_model(model, base_model)
        save_adapter(model, f"{path}-adapter", tokenizer)
        atomic_write_dir(path, lambda tmp: save_model_folder(tmp, merged(model), tokenizer))
    trainer.accelerator.wait_for_everyone()
    return path
