"""`compile_layer_parts`: torch.compile the parts of each decoder layer that never see a KV cache.

A decoder layer's norms and MLP are matmuls wrapped in element-wise work (RMSNorm's square,
mean, rsqrt and scale; SwiGLU's SiLU and product), each op a pass over the activations in
eager mode, forward and backward. Compiled, each part's element-wise ops fuse into one pass
(what liger-kernel's RMSNorm and SwiGLU kernels do on CUDA; Inductor generates the kernels on
CPUs and GPUs alike), while its matmuls still run in the BLAS/cuBLAS kernels eager uses.

The attention is left as it is: it takes the KV cache during generation and the shared-prefix
forward, and a compiled graph would be specialised to each layer's cache index (one compile per
layer). Each part's class forward is compiled once and bound to its instances: one graph serves
every layer's instance (their parameters are graph inputs), each class has its own recompile
budget (grad and no-grad calls, autocast), and a deep copy (a LoRA merge) binds the copy. The
parameter names do not change, so checkpoints and weight syncs read the model as before.
"""

from __future__ import annotations

import inspect
import types

import torch
from torch import nn

from rlhf.workers.fsdp import decoder_layers


def takes_one_tensor(module: nn.Module) -> bool:
    """Whether `module`'s forward takes one argument (a norm, an MLP): an attention also takes the cache, the mask
    and the rotary embeddings, so it never qualifies."""
    return len(inspect.signature(module.forward).parameters) == 1


def _on_rows(compiled):
    """`compiled(self, x)` on x flattened to (tokens, features): one graph whatever the leading dims (a packed
    micro-batch is one row of many tokens, a padded one many rows), so calls do not compile again for each."""

    def forward(self, x):
        out = compiled(self, x.reshape(-1, x.shape[-1]))
        return out.view(*x.shape[:-1], out.shape[-1])

    forward.compiled_by_rlhf = True  # is_compiled() reads it
    return forward


def compile_layer_parts(model: nn.Module) -> list[str]:
    """Compile, in place, every direct child of each decoder layer whose forward takes one tensor (not the attention).

    Returns the compiled modules' names. Shapes are dynamic from the first call (sequence
    lengths and row counts change every step), so a new length does not compile again. Raises
    when the model names no decoder layer (`_no_split_modules`), because then nothing would be
    compiled and the setting would silently do nothing.
    """
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(f"compile=True: {type(model).__name__} names no decoder layer class (_no_split_modules), "
                         "so there is nothing to compile layer by layer; set compile=False for this model")
    names = {id(m): name for name, m in model.named_modules()}
    forwards: dict[type, object] = {}  # one compiled forward per class
    compiled = []
    for layer in layers:
        for part in layer.children():
            if not takes_one_tensor(part) or not any(True for _ in part.parameters()) or is_compiled(part):
                continue  # attention (cache, mask), a parameter-free module (dropout), compiled already
            cls = type(part)
            if cls not in forwards:
                forwards[cls] = _on_rows(torch.compile(cls.forward, dynamic=True))
            part.forward = types.MethodType(forwards[cls], part)
            compiled.append(names[id(part)])
    return compiled


def is_compiled(module: nn.Module) -> bool:
    """Whether `module`'s forward was compiled in place by `compile_layer_parts`."""
    forward = module.__dict__.get("forward")
    return isinstance(forward, types.MethodType) and getattr(forward.__func__, "compiled_by_rlhf", False)


def compiled_parts(model: nn.Module) -> list[str]:
    """Names of the modules of `model` compiled in place."""
    return [name for name, m in model.named_modules() if is_compiled(m)]


__all__ = ["compile_layer_parts", "compiled_parts", "is_compiled", "takes_one_tensor"]
