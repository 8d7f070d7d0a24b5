"""What an agent program's way to the gateway costs per request: in-process (ASGI) vs loopback HTTP.

The engine answers instantly (one EOS token, no model), so what is timed is everything else a chat
completion goes through in the agent loop (rlhf.agent_programs): the openai client, the transport, the
FastAPI app, the session's trajectory builder (chat template render and tokenisation), the scheduler's
hand-off to its generate thread, and the reply. Two shapes, each transport alternated over `--rounds`:

- `sequential`: one attempt sending `--requests` chat completions one after another (latency per request);
- `concurrent`: `--attempts` attempts at once, each sending `--turns` requests (wall seconds per request
  over all of them: what a step of many attempts pays).

The scheduler's batch wait is 0 here, so no request waits for company. Prints and writes
benchmarks/results/agent_transport-<time>.json with the medians.

    OMP_NUM_THREADS=1 python benchmarks/agent_transport.py       # ~1 minute
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from rlhf.agent_programs import AgentProgramRollout
from rlhf.batch import Batch
from rlhf.data.prompts import PromptDataset
from rlhf.models.loading import load_tokenizer
from rlhf.models.tiny import tiny_qwen2
from rlhf.rollout.engine import rollout_batch
from rlhf.rollout.sampling import SamplingParams

ROOT = Path(__file__).parents[1]


def instant_generate(tokenizer):
    """An engine that answers every prompt with its EOS token at once."""

    def generate(prompts: Batch, sampling: SamplingParams) -> Batch:
        responses = torch.full((len(prompts), 1), tokenizer.eos_token_id)
        return rollout_batch(prompts, responses, torch.zeros(len(prompts), 1), sampling,
                             [tokenizer.eos_token_id], tokenizer.pad_token_id)

    return generate


def conversational_agent(turns: int):
    async def run(task, client):
        messages = [{"role": "user", "content": task["prompt"][0]["content"]}]
        for turn in range(turns):
            reply = await client.chat.completions.create(model="any", messages=messages)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                         {"role": "user", "content": f"And then? ({turn})"}]
        return 1.0

    return run


def timed(transport: str, tokenizer, prompts: Batch, n: int, turns: int) -> float:
    """Seconds per request for len(prompts) x n attempts of `turns` requests each."""
    rollout = AgentProgramRollout(conversational_agent(turns), tokenizer, max_concurrent=max(64, len(prompts) * n),
                                  batch_wait_ms=0.0, transport=transport, max_response_tokens=1 << 14)
    started = time.perf_counter()
    _, metrics = rollout.rollout(instant_generate(tokenizer), prompts, SamplingParams(n=n, max_new_tokens=4))
    seconds = time.perf_counter() - started
    requests = metrics["num_turns/mean"] * metrics["agent/trajectories"]
    assert requests == len(prompts) * n * turns, metrics
    return seconds / requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20, help="sequential: requests of the one attempt")
    parser.add_argument("--attempts", type=int, default=64, help="concurrent: attempts at once")
    parser.add_argument("--turns", type=int, default=4, help="concurrent: requests per attempt")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(tiny_qwen2(str(Path.home() / ".cache" / "rlhf" / "bench-agent-transport")))
    rows = [{"data_source": "chat", "prompt": [{"role": "user", "content": f"Question {i}?"}],
             "reward_model": {"ground_truth": "1"}, "extra_info": {}}
            for i in range(args.attempts)]
    dataset = PromptDataset(rows, tokenizer, raw_prompt=True)
    one, many = dataset.collate([0]), dataset.collate(range(args.attempts))
    shapes = {"sequential": (one, 1, args.requests), "concurrent": (many, 1, args.turns)}
    transports = ("in_process", "loopback")
    for transport in transports:  # warm-up (imports, first app build)
        timed(transport, tokenizer, one, 1, 2)
    samples: dict[str, dict[str, list[float]]] = {s: {t: [] for t in transports} for s in shapes}
    load_before = os.getloadavg()
    for _ in range(args.rounds):
        for shape, (prompts, n, turns) in shapes.items():
            for transport in transports:
                samples[shape][transport].append(timed(transport, tokenizer, prompts, n, turns))
    medians = {s: {t: statistics.median(v) * 1000 for t, v in by.items()} for s, by in samples.items()}
    report = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": "python benchmarks/agent_transport.py" + "".join(f" {a}" for a in sys.argv[1:]),
        "ms_per_request_median": medians,
        "loopback_over_in_process": {s: m["loopback"] / m["in_process"] for s, m in medians.items()},
        "samples_ms": {s: {t: [x * 1000 for x in v] for t, v in by.items()} for s, by in samples.items()},
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "settings": vars(args),
    }
    for shape, by in medians.items():
        print(f"{shape:>10}: in-process {by['in_process']:.2f} ms/request, loopback {by['loopback']:.2f} ms/request "
              f"({by['loopback'] / by['in_process']:.2f}x)")
    out = ROOT / "benchmarks" / "results" / f"agent_transport-{datetime.datetime.now():%Y%m%d-%H%M%S}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
