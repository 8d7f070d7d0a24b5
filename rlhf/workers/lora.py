"""LoRA through PEFT: wrap a causal LM with a low-rank adapter, save the adapter alone, merge it.

Optional: needs `peft` (`pip install -c constraints.txt peft`); importing this module works
without it, and using it raises an ImportError that says how to install it.

    lora = LoRA(rank=8, alpha=16)
    model = lora(load_causal_lm(path))         # only the adapter's A/B matrices are trainable
    save_adapter(model, "out/adapter")         # adapter_config.json + adapter_model.safetensors
    merge_adapter("out/adapter", "out/merged") # a plain HF model folder (W + alpha/r * B A)

In a graph: `PolicyWorker(adapter=LoRA(...))`, or `--config fiddler:lora(rank=16, alpha=32)` on any
recipe (rlhf_configs.common.lora). The policy worker then uses the base model with the adapter
disabled as the reference policy when the reference is the policy's own base model.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import torch

from rlhf.io.atomic import atomic_write_dir
from rlhf.io.manifest import write_manifest
from rlhf.models.adapters import ADAPTER_CONFIG, peft_module
from rlhf.models.loading import load_causal_lm, load_tokenizer
from rlhf.models.saving import save_model_folder, save_tokenizer

# Qwen2/Llama attention and MLP projections
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRA:
    """A model wrapper: `LoRA(...)(model)` freezes `model` and adds rank-`rank` adapters to `target_modules`.

    Each adapted linear layer computes W x + (alpha / rank) B A x, with A (rank, in) random and
    B (out, rank) zero at the start, so the wrapped model starts equal to the base model. A's
    initialisation draws from torch's global generator: the worker seeds it first
    (TrainingSetup.seed), so a run's adapter starts the same every time.
    """

    def __init__(
        self,
        rank: int = 8,  # adapter rank r
        alpha: float = 16,  # scale alpha / rank of the adapter's output
        dropout: float = 0.0,  # dropout on the adapter's input
        target_modules: Sequence[str] = DEFAULT_TARGETS,  # names of the linear layers to adapt
    ):
        if rank < 1:
            raise ValueError(f"LoRA: rank must be >= 1, got {rank}")
        self.rank = rank
        self.alpha = alpha
        self.dropout = dropout
        self.target_modules = tuple(target_modules)

    def __call__(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` frozen with adapters; a sequence-classification model (a reward model) keeps its score head
        trainable, whole (PEFT's SEQ_CLS task: the head is new, so an adapter of it would learn nothing)."""
        peft = peft_module()
        task = "SEQ_CLS" if type(model).__name__.endswith("ForSequenceClassification") else "CAUSAL_LM"
        config = peft.LoraConfig(
            r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
            target_modules=list(self.target_modules), task_type=task,
        )
        return peft.get_peft_model(model, config)


def is_adapted(model: torch.nn.Module) -> bool:
    """Whether `model` is a PEFT model (an adapter around a frozen base)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def set_base_model(model: torch.nn.Module, base: str) -> None:
    """Record `base` (a folder or hub id) as the base model in the adapter's config, so a saved adapter
    names where its base is (a model built on the meta device, as FSDP's ranks do, knows no path)."""
    for config in model.peft_config.values():
        config.base_model_name_or_path = base


def save_adapter_config(model: torch.nn.Module, folder: str | Path) -> None:
    """Only `adapter_config.json` (rank, alpha, targets, base model): what turns a checkpoint's
    trainable weights back into an adapter (`rlhf export`)."""
    model.peft_config["default"].save_pretrained(str(folder))


def save_adapter(model: torch.nn.Module, path: str, tokenizer=None) -> str:
    """Write only the adapter (config + weights, a few MB for a 0.5B model), with the tokenizer when
    given, atomically; returns `path`."""

    def write(tmp: Path) -> None:
        model.save_pretrained(str(tmp))
        if tokenizer is not None:
            save_tokenizer(tokenizer, tmp)
        write_manifest(tmp)  # last: a stage that starts from the adapter checks it

    atomic_write_dir(path, write)
    return path


def merged(model: torch.nn.Module) -> torch.nn.Module:
    """A plain model with the adapter folded into its weights (W + alpha/r B A); `model` is unchanged."""
    return copy.deepcopy(model).merge_and_unload()


def merge_adapter(adapter_path: str, out: str, dtype: str = "float32") -> str:
    """An adapter folder (its base model found from its config) -> a merged Hugging Face model folder
    with the tokenizer."""
    if not (Path(adapter_path) / ADAPTER_CONFIG).is_file():
        raise FileNotFoundError(f"{adapter_path} is not an adapter folder: it has no {ADAPTER_CONFIG}")
    model, tokenizer = load_causal_lm(adapter_path, dtype), load_tokenizer(adapter_path)
    atomic_write_dir(out, lambda tmp: save_model_folder(tmp, model, tokenizer))
    return out


__all__ = ["DEFAULT_TARGETS", "LoRA", "is_adapted", "merge_adapter", "merged", "peft_module", "save_adapter",
           "save_adapter_config", "set_base_model"]
