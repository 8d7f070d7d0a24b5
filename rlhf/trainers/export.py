"""`rlhf export CKPT OUT`: a training checkpoint -> a Hugging Face model folder.

A checkpoint's `policy/` folder holds the policy's resumable state and `hf/` (config,
generation config, tokenizer with its chat template). The state is either a sharded
`torch.distributed.checkpoint` (`dcp/`, written by every rank: the current format, from DDP or
FSDP at any world size, rlhf.workers.state_io) or Accelerate's former format (full weights in
`model.safetensors`, written by rank 0). The export builds the model from the config, reads the
weights in this process alone (no process group, no GPU: a DCP checkpoint is read shard by shard
into the whole model), re-ties shared embeddings, and saves safetensors + tokenizer atomically.
A folder that is already a Hugging Face model (`final/`) is rewritten the same way.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from rlhf.io.atomic import atomic_write_dir
from rlhf.trainers.checkpoint import CheckpointManager
from rlhf.workers.state_io import is_dcp_state, read_model_state


def _has_weights(folder: Path) -> bool:
    return is_dcp_state(folder) or (folder / "model.safetensors").exists()


def _policy_folder(checkpoint: Path) -> tuple[Path, Path]:
    """(the folder holding the weights, the folder holding config.json and the tokenizer)."""
    for candidate in (checkpoint / "policy", checkpoint):
        if _has_weights(candidate) and (candidate / "hf" / "config.json").exists():
            return candidate, candidate / "hf"
    if (checkpoint / "model.safetensors").exists() and (checkpoint / "config.json").exists():
        return checkpoint, checkpoint  # a Hugging Face folder (a stage's final/)
    if (checkpoint / "checkpoints").is_dir() and (latest := CheckpointManager(checkpoint / "checkpoints").latest()):
        return _policy_folder(latest)
    raise FileNotFoundError(
        f"{checkpoint} is not a training checkpoint: expected policy/dcp/.metadata (or policy/model.safetensors) "
        "and policy/hf/config.json (a folder like <stage dir>/checkpoints/step_00000010, or a stage folder to take "
        "its newest checkpoint), or a Hugging Face model folder (config.json and model.safetensors)"
    )


def export_checkpoint(checkpoint: str, out: str) -> str:
    folder, hf = _policy_folder(Path(checkpoint))
    config = AutoConfig.from_pretrained(hf)
    if is_dcp_state(folder):
        with torch.device("cpu"):  # real tensors: DCP reads into them (rotary buffers are computed here)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        try:
            read_model_state(folder, model)
        except Exception as err:  # a key or shape the config does not have
            raise ValueError(f"checkpoint {folder} does not match its config {hf / 'config.json'}: "
                             f"{type(err).__name__}: {str(err).strip().splitlines()[0][:500]}") from err
    else:
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
    if (hf / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(hf)
    tokenizer = AutoTokenizer.from_pretrained(hf)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    atomic_write_dir(out, write)
    return out
