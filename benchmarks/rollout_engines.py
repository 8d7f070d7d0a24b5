"""Rollout tokens/s: VLLMEngine vs the transformers engine (HFEngine), same prompts, same sampling.

CPU (in .venv-vllm, from `bash scripts/test_vllm.sh`; one torch thread, in-process engine):
    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=1 \\
        .venv-vllm/bin/python benchmarks/rollout_engines.py --json benchmarks/results/rollout_engines_cpu.json
    (--hidden-size 128: the model of arithmetic_tiny's fiddler:vllm; results in docs/rollout_engines.md)
GPU (official vllm wheel; a Qwen2.5-0.5B-shaped random bf16 model, the shape of benchmarks/gpu_step.py):
    python benchmarks/rollout_engines.py --gpu --prompts 32 --n 8 --max-new-tokens 256

Both engines decode the same left-padded prompts with temperature 1 and `min_new_tokens =
max_new_tokens` (every row decodes the full length, so both produce the same number of tokens);
the first call of each engine is a warm-up. Engines alternate A/B and medians are reported
(runs on a shared machine vary by +-20%). Also timed: one weight sync into vLLM (`update_weights`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden-size", type=int, default=64,
                        help="CPU model width: heads of 32 (vLLM's CPU minimum), half as many KV heads; "
                             "128 is arithmetic_tiny's fiddler:vllm shape")
    parser.add_argument("--gpu", action="store_true", help="CUDA, bf16, a Qwen2.5-0.5B-shaped model")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from rlhf.batch import Batch
    from rlhf.data.tokenize import chat_prompt_ids, left_pad, position_ids
    from rlhf.models.tiny import tiny_qwen2
    from rlhf.rollout import HFEngine, SamplingParams
    from rlhf.rollout.engine import named_weights
    from rlhf.rollout.vllm_engine import VLLMEngine

    root = os.path.join(tempfile.gettempdir(), "rlhf-bench-models")
    if args.gpu:  # Qwen2.5-0.5B's shape (benchmarks/gpu_step.py), random weights
        path = tiny_qwen2(os.path.join(root, "qwen05b-shape"), hidden_size=896, num_layers=24, num_heads=14,
                          num_kv_heads=2, intermediate_size=4864, vocab_size=151936, max_position_embeddings=2048)
        device, dtype = "cuda", "bfloat16"
    else:  # a tiny model vLLM's CPU attention accepts (head_dim 32)
        h = args.hidden_size
        path = tiny_qwen2(os.path.join(root, f"vllm-h{h}-l2"), hidden_size=h, num_layers=2, num_heads=h // 32,
                          num_kv_heads=max(1, h // 64), intermediate_size=4 * h)
        device, dtype = "cpu", "float32"
    max_len = 256 + args.max_new_tokens
    vllm = VLLMEngine(path, dtype=dtype, max_model_len=max_len, enable_sleep_mode=False)
    hf = HFEngine(path, dtype=dtype, device=device)
    tok = hf.tokenizer
    rows = [chat_prompt_ids(tok, [{"role": "user", "content": f"What is {i} plus {2 * i + 7}? Think step by step."}])
            for i in range(args.prompts)]
    ids, mask = left_pad(rows, tok.pad_token_id)
    prompts = Batch({"input_ids": ids, "attention_mask": mask, "position_ids": position_ids(mask)})
    sampling = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens,
                              min_new_tokens=args.max_new_tokens)
    engines = {"vllm": vllm, "hf": hf}
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    tokens: dict[str, int] = {}
    for name, engine in engines.items():  # warm-up
        engine.generate(prompts.to(device) if name == "hf" else prompts, sampling, seed=0)
    for r in range(args.repeats):
        for name in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
            batch = prompts.to(device) if name == "hf" else prompts
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = engines[name].generate(batch, sampling, seed=r + 1)
            if device == "cuda":
                torch.cuda.synchronize()
            seconds[name].append(time.perf_counter() - start)
            tokens[name] = int(out["response_mask"].sum())
    sync = []
    for _ in range(3):
        start = time.perf_counter()
        vllm.update_weights(named_weights(hf.model))
        sync.append(time.perf_counter() - start)
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (1 thread)",
        "load_average_1min": os.getloadavg()[0],  # other jobs on a shared machine
        "shape": {"prompts": args.prompts, "n": args.n, "max_new_tokens": args.max_new_tokens, "model": path},
        **{name: {"median_s": statistics.median(s), "tokens": tokens[name],
                  "tokens_per_s": tokens[name] / statistics.median(s), "runs_s": s} for name, s in seconds.items()},
        "vllm_weight_sync_median_s": statistics.median(sync),
    }
    for name in engines:
        print(f"{name:5s} {result[name]['median_s']:.3f} s  {result[name]['tokens_per_s']:.0f} tok/s "
              f"({result[name]['tokens']} tokens)")
    print(f"vllm weight sync: {result['vllm_weight_sync_median_s'] * 1e3:.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
