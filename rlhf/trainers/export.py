"""`rlhf export SOURCE OUT`: a run's weights -> a plain Hugging Face model folder (safetensors,
config, generation config, tokenizer with its chat template), portable to another machine.

SOURCE may be any of (`find_source` decides, and the result says which it took):
- a stage folder (`<output_dir>/<experiment>/<run>/<stage>`): its `final/` when the stage finished,
  else its newest intact checkpoint; `step=N` takes `checkpoints/step_<N>` instead;
- a checkpoint folder (`checkpoints/step_XXXXXXXX`, or its `policy/`): the policy's resumable state,
  either a sharded `torch.distributed.checkpoint` (`dcp/`, from DDP or FSDP at any world size,
  rlhf.workers.state_io) or Accelerate's former format (`model.safetensors`), with `hf/` (config,
  generation config, tokenizer). The weights are read in this process alone (no process group, no
  GPU); a tied embedding is re-tied;
- a LoRA run's checkpoint: it holds only the adapter's weights and `hf/adapter_config.json`,
  which names the base model; the export loads the base, reads the adapter and merges it
  (W + alpha/r B A). `base=` overrides a base that has moved;
- a Hugging Face model folder (a stage's `final/`, or an RL stage's `best/`): rewritten (in `dtype`, portable);
- a PEFT adapter folder (a LoRA stage's `final-adapter/`, TRL's output): merged into its base.

Everything is written atomically (rlhf.io.atomic); the folder carries no machine-local keys
(rlhf.models.saving).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from rlhf.io.atomic import atomic_write_dir
from rlhf.models.adapters import ADAPTER_CONFIG, adapter_base_name, is_adapter_folder, merge_adapter_into, peft_module
from rlhf.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
from rlhf.models.saving import save_model_folder
from rlhf.trainers.checkpoint import CheckpointManager, verify
from rlhf.workers.state_io import is_dcp_state, read_model_state

DTYPES = ("float32", "bfloat16", "float16")


class ExportError(ValueError):
    """The source cannot be exported; the message says what was found and what to pass instead."""


@dataclasses.dataclass(frozen=True)
class Exported:
    out: str  # the written model folder
    source: Path  # the folder the weights came from
    what: str  # e.g. "checkpoint step_00000010 (LoRA adapter merged into ...)"


def _is_model_folder(folder: Path) -> bool:
    weights = any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))
    return (folder / "config.json").is_file() and weights


def _policy_state(checkpoint: Path) -> Path | None:
    """The folder holding a checkpoint's policy state (weights and `hf/`), or None."""
    for candidate in (checkpoint / "policy", checkpoint):
        if (candidate / "hf" / "config.json").is_file() and (
                is_dcp_state(candidate) or (candidate / "model.safetensors").is_file()):
            return candidate
    return None


def find_source(path: str | Path, step: int | None = None) -> tuple[str, Path]:
    """(kind, folder) of what `path` holds: kind is "checkpoint", "model" or "adapter"."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ExportError(f"{path} does not exist")
    if step is not None:
        root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        folder = root / f"step_{step:08d}"
        if _policy_state(folder) is None:
            steps = [p.name for p in CheckpointManager(root).complete()]
            raise ExportError(f"{root} has no checkpoint of step {step} (there: {', '.join(steps) or 'none'})")
        return "checkpoint", folder
    if _policy_state(path) is not None:
        return "checkpoint", path
    if is_adapter_folder(path):
        return "adapter", path
    if _is_model_folder(path):
        return "model", path
    if _is_model_folder(path / "final"):
        return "model", path / "final"
    for root in (path / "checkpoints", path):  # a stage folder, or its checkpoints/ folder
        if root.is_dir() and (latest := CheckpointManager(root).latest()):
            return "checkpoint", latest
    raise ExportError(
        f"{path} holds nothing to export. Expected a stage folder (with final/ or checkpoints/step_*), a checkpoint "
        "(checkpoints/step_XXXXXXXX with policy/hf/config.json and policy/dcp/), a Hugging Face model folder "
        "(config.json and *.safetensors) or a PEFT adapter folder (adapter_config.json)."
    )


def export_checkpoint(
    source: str, out: str, step: int | None = None, base: str | None = None, dtype: str = "float32",
) -> str:
    """Export `source` (see the module docstring) to the model folder `out`; returns `out`."""
    return export(source, out, step=step, base=base, dtype=dtype).out


def export(source: str, out: str, step: int | None = None, base: str | None = None,
           dtype: str = "float32") -> Exported:
    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    kind, folder = find_source(source, step)
    if Path(out).expanduser().resolve() == folder.resolve():
        raise ExportError(f"the output folder {out} is the source itself; give another folder")
    if kind == "checkpoint":
        model, tokenizer, what = _from_checkpoint(folder, base)
    elif kind == "adapter":
        model, tokenizer, what = _from_adapter(folder, base)
    else:
        model, tokenizer, what = load_causal_lm(str(folder)), load_tokenizer(str(folder)), "model folder"
    model = model.to(getattr(torch, dtype))
    atomic_write_dir(out, lambda tmp: save_model_folder(tmp, model, tokenizer))
    return Exported(out, folder, what)


def _from_adapter(folder: Path, base: str | None):
    if base is None:
        return load_causal_lm(str(folder)), load_tokenizer(str(folder)), f"adapter merged into {adapter_base_name(folder)}"
    model = merge_adapter_into(load_causal_lm(base), folder)
    tokenizer = load_tokenizer(str(folder) if (folder / "tokenizer_config.json").is_file() else base)
    return model, tokenizer, f"adapter merged into {base}"


def _from_checkpoint(checkpoint: Path, base: str | None):
    folder = _policy_state(checkpoint)
    hf = folder / "hf"
    if checkpoint.name.startswith("step_") and (reason := verify(checkpoint)) is not None:
        raise ExportError(f"checkpoint {checkpoint} is damaged: {reason}. Export an older one (--step N).")
    name = checkpoint.name if checkpoint.name.startswith("step_") else str(checkpoint)
    if (hf / ADAPTER_CONFIG).is_file():
        model, base_name = _lora_checkpoint(folder, hf, base)
        what = f"checkpoint {name} (LoRA adapter merged into {base_name})"
    elif is_dcp_state(folder):
        with torch.device("cpu"):  # real tensors: DCP reads into them (rotary buffers are computed here)
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(hf), dtype=torch.float32)
        _read(folder, model, hf)
        what = f"checkpoint {name}"
    else:
        model = _accelerate_format(folder, hf)
        what = f"checkpoint {name} (Accelerate format)"
    if (hf / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(hf)
    return model, AutoTokenizer.from_pretrained(hf), what


def _lora_checkpoint(folder: Path, hf: Path, base: str | None):
    """The base model with the checkpoint's adapter weights, merged; and the base's name."""
    peft = peft_module()
    base = base or adapter_base_name(hf)
    try:
        base_path = resolve_model_path(base)
    except FileNotFoundError as err:
        raise ExportError(f"{folder} is a LoRA checkpoint whose base model cannot be found ({err}). "
                          "Pass the base model's folder with --base PATH.") from err
    model = peft.get_peft_model(load_causal_lm(base_path), peft.LoraConfig.from_pretrained(str(hf)))
    _read(folder, model, hf)
    return model.merge_and_unload(), base


def _read(folder: Path, model: torch.nn.Module, hf: Path) -> None:
    try:
        read_model_state(folder, model)
    except Exception as err:  # a key or shape the config does not have
        raise ExportError(f"checkpoint {folder} does not match its config {hf / 'config.json'}: "
                          f"{type(err).__name__}: {str(err).strip().splitlines()[0][:500]}") from err


def _accelerate_format(folder: Path, hf: Path) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(hf)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    state = load_file(str(folder / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ExportError(f"checkpoint {folder} does not match its config: missing {sorted(set(missing) - tied)}, "
                          f"unexpected {sorted(unexpected)}")
    return model
