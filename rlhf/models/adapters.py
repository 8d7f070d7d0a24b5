"""PEFT adapter folders as models: recognised, their base model named, merged into it.

An adapter folder is what `PeftModel.save_pretrained` writes (LoRA training here, TRL, PEFT):
`adapter_config.json` (rank, alpha, target modules, and `base_model_name_or_path`) and
`adapter_model.safetensors`, often with the tokenizer beside them, but no model weights.
`rlhf.models.loading` loads such a folder as the base model with the adapter merged in
(W + alpha/r B A), so `rlhf serve`, `rlhf generate`, `rlhf eval`, `rlhf export` and a stage's
`model_path` take it like any model folder.

`peft` is optional: recognising a folder works without it; merging raises an ImportError that
says how to install it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

ADAPTER_CONFIG = "adapter_config.json"
_MODEL_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                  "pytorch_model.bin.index.json")


def peft_module():
    """`import peft`, or an ImportError saying how to install it."""
    try:
        import peft
    except ImportError as err:
        raise ImportError(
            "LoRA adapters need the optional package peft: .venv/bin/python -m pip install -c constraints.txt peft "
            "(or `pip install 'rlhf[lora]'`)"
        ) from err
    return peft


def is_adapter_folder(path: str | Path) -> bool:
    """A folder holding an adapter and no model weights of its own."""
    folder = Path(path).expanduser()
    return (folder / ADAPTER_CONFIG).is_file() and not any((folder / name).exists() for name in _MODEL_WEIGHTS)


def adapter_base_name(path: str | Path) -> str:
    """The base model an adapter folder names (`base_model_name_or_path`): a path or a hub id.
    A relative path is taken relative to the adapter folder where that folder exists (a folder of the same
    relative name beside the current directory, e.g. an unrelated `../base`, must not win), else as given."""
    folder = Path(path).expanduser()
    config_file = folder / ADAPTER_CONFIG
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"adapter folder {folder}: {ADAPTER_CONFIG} is unreadable ({err})") from err
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not base:
        raise ValueError(
            f"adapter folder {folder} does not name its base model (base_model_name_or_path in {config_file} is "
            f"empty): set it to the base model's folder or hub id"
        )
    relative = folder / base
    if not Path(base).expanduser().is_absolute() and relative.is_dir():
        return str(relative)
    return str(base)


def merge_adapter_into(model: torch.nn.Module, adapter_path: str | Path) -> torch.nn.Module:
    """`model` (the base, loaded) with the adapter in `adapter_path` folded into its weights: a plain module."""
    peft = peft_module()
    return peft.PeftModel.from_pretrained(model, str(adapter_path)).merge_and_unload()
