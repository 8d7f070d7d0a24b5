"""`rlhf export CKPT OUT`: a training checkpoint -> a Hugging Face model folder.

A checkpoint's `policy/` folder holds Accelerate's state (full weights written by rank 0,
whatever the number of data-parallel workers) and `hf/` (config, generation config,
tokenizer with its chat template). The export loads the weights into a model built from the
config, re-ties shared embeddings, and saves safetensors + tokenizer atomically.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from rlhf.io.atomic import atomic_write_dir
from rlhf.trainers.checkpoint import CheckpointManager


def _policy_folder(checkpoint: Path) -> Path:
    for candidate in (checkpoint / "policy", checkpoint):
        if (candidate / "model.safetensors").exists() and (candidate / "hf" / "config.json").exists():
            return candidate
    if (checkpoint / "checkpoints").is_dir() and (latest := CheckpointManager(checkpoint / "checkpoints").latest()):
        return _policy_folder(latest)
    raise FileNotFoundError(
        f"{checkpoint} is not a training checkpoint: expected policy/model.safetensors and policy/hf/config.json "
        "(a folder like <stage dir>/checkpoints/step_00000010, or a stage folder to take its newest checkpoint)"
    )


def export_checkpoint(checkpoint: str, out: str) -> str:
    folder = _policy_folder(Path(checkpoint))
    config = AutoConfig.from_pretrained(folder / "hf")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    state = load_file(str(folder / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ValueError(
            f"checkpoint {folder} does not match its config: missing {sorted(set(missing) - tied)}, "
            f"unexpected {sorted(unexpected)}"
        )
    model.generation_config = GenerationConfig.from_pretrained(folder / "hf")
    tokenizer = AutoTokenizer.from_pretrained(folder / "hf")

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    atomic_write_dir(out, write)
    return out
