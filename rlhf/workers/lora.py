"""LoRA through PEFT: wrap a causal LM with a low-rank adapter, save the adapter alone, merge it.

Optional: needs `peft` (`pip install -c constraints.txt peft`); importing this module works
without it, and using it raises an ImportError that says how to install it.

    lora = LoRA(r=8, alpha=16)
    model = lora(load_causal_lm(path))         # only the adapter's A/B matrices are trainable
    save_adapter(model, "out/adapter")         # adapter_config.json + adapter_model.safetensors
    merge_adapter(path, "out/adapter", "out/merged")   # a plain HF model folder (W + alpha/r * B A)
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from rlhf.io.atomic import atomic_write_dir
from rlhf.models.loading import load_causal_lm, load_tokenizer

# Qwen2/Llama attention and MLP projections
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _peft():
    try:
        import peft
    except ImportError as err:
        raise ImportError(
            "LoRA needs the optional package peft: .venv/bin/python -m pip install -c constraints.txt peft"
        ) from err
    return peft


class LoRA:
    """A model wrapper: `LoRA(...)(model)` freezes `model` and adds rank-`r` adapters to `target_modules`.

    Each adapted linear layer computes W x + (alpha / r) B A x, with A (r, in) random and
    B (out, r) zero at the start, so the wrapped model starts equal to the base model.
    """

    def __init__(
        self,
        r: int = 8,  # adapter rank
        alpha: float = 16,  # scale alpha / r of the adapter's output
        dropout: float = 0.0,  # dropout on the adapter's input
        target_modules: Sequence[str] = DEFAULT_TARGETS,  # names of the linear layers to adapt
    ):
        self.r = r
        self.alpha = alpha
        self.dropout = dropout
        self.target_modules = tuple(target_modules)

    def __call__(self, model: torch.nn.Module) -> torch.nn.Module:
        peft = _peft()
        config = peft.LoraConfig(
            r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout,
            target_modules=list(self.target_modules), task_type="CAUSAL_LM",
        )
        return peft.get_peft_model(model, config)


def save_adapter(model: torch.nn.Module, path: str) -> str:
    """Write only the adapter (config + weights, a few MB for a 0.5B model) atomically; returns `path`."""
    atomic_write_dir(path, lambda tmp: model.save_pretrained(tmp))
    return path


def merged(model: torch.nn.Module) -> torch.nn.Module:
    """A plain model with the adapter folded into its weights (W + alpha/r B A); `model` is unchanged."""
    return copy.deepcopy(model).merge_and_unload()


def merge_adapter(base_path: str, adapter_path: str, out: str, dtype: str = "float32") -> str:
    """Base model folder + adapter folder -> a merged Hugging Face model folder (with the tokenizer)."""
    peft = _peft()
    model = peft.PeftModel.from_pretrained(load_causal_lm(base_path, dtype), adapter_path).merge_and_unload()
    tokenizer = load_tokenizer(base_path)

    def write(tmp):
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    atomic_write_dir(out, write)
    return out
