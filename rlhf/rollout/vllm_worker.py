"""The weight-sync extension of vLLM's worker (`LLM(worker_extension_cls=...)`), and its CPU fix.

`WeightSync.rlhf_load_weights(named tensors)` runs inside vLLM's worker and hands a bucket of
Hugging Face-named tensors to the model's own `load_weights`, which maps them onto vLLM's fused
layers (q/k/v -> qkv_proj, gate/up -> gate_up_proj) and skips a tied LM head: the same call
verl and TRL make on GPUs. (The method name must not be one of vLLM's Worker methods, e.g.
`update_weights`: the engine refuses to start then.)

On CPUs, vLLM's build packs every dense linear weight into a kernel-specific copy when the
model loads (`dispatch_cpu_unquantized_gemm`) and empties `layer.weight`, so later loads would
fail or leave the packed copy (a tied LM head's) stale. Importing this module before the model
loads makes that dispatch keep the plain weight and compute with `F.linear` on it: new weights
then take effect as on a GPU (token-exact with transformers; docs/rollout_engines.md, "CPU vs GPU vLLM").
Only the CPU platform is touched, and only in processes that import this module.
"""

from __future__ import annotations

import torch

from rlhf.rollout.engine import WeightDigest


def _keep_live_cpu_weights() -> None:
    from vllm.model_executor.layers import utils
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or getattr(utils, "_rlhf_live_weights", False):
        return

    def dispatch_plain_linear(layer: torch.nn.Module, remove_weight: bool) -> None:
        """The weight stays a plain Parameter, read at every call (no packed copy to go stale)."""
        layer.cpu_linear = torch.nn.functional.linear

    utils.dispatch_cpu_unquantized_gemm = dispatch_plain_linear
    utils._rlhf_live_weights = True


_keep_live_cpu_weights()


class WeightSync:
    """Mixed into vLLM's Worker: `self.model_runner` is the worker's."""

    def rlhf_load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        """Load one bucket of (Hugging Face name, full tensor) into the running model."""
        model = self.model_runner.model
        device = next(model.parameters()).device
        model.load_weights((name, tensor.to(device, non_blocking=True)) for name, tensor in weights)

    def rlhf_weight_digests(self, names: list[str]) -> dict:
        """`WeightDigest`s of the running model's parameters under these names (the sync check)."""
        params = dict(self.model_runner.model.named_parameters(remove_duplicate=False))
        return {name: WeightDigest.of(params[name]) for name in names if name in params}
