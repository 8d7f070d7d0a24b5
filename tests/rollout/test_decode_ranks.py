"""Decoding with an FSDP2-sharded model on 2 gloo ranks whose rows finish at different steps completes.

A sharded module's own forward all-gathers weights in every step, so a rank that stops early
would leave the other in a collective (reproduced before this change: a gloo timeout). Two
paths must complete: the model's forward (here forced by a hook), where the ranks agree on the
last step through the all-reduced finished-rows check, and the lean step, which gathers the
weights once and runs no collective per step (and still gives the unsharded model's tokens).
"""

import datetime
import os
import socket
import time

import torch
import torch.multiprocessing as mp

from rlhf.rollout.decode import sample

PAD, EOS = 0, 1
FINISH = {0: [2, 1], 1: [9, 4]}  # per rank, the decoding step at which each of its 2 rows emits EOS


def qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)).eval()


def rank_prompts(rank):
    g = torch.Generator().manual_seed(10 + rank)
    return torch.randint(2, 50, (2, 6), generator=g), torch.ones(2, 6, dtype=torch.long)


def run_rank(rank, port, out_dir):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=datetime.timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (2,))
    model = qwen2()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    ids, mask = rank_prompts(rank)
    kwargs = dict(n=1, max_new_tokens=30, eos_token_ids=[EOS], pad_token_id=PAD, temperature=0.0)
    lean = sample(model, ids, mask, **kwargs)  # rows end whenever greedy says: no collective per step

    def forced(check_every):
        """Row i emits EOS at step FINISH[rank][i] (a hook: the model's own forward); (tokens, forwards run)."""
        calls = []

        def finish(module, inputs, logits):
            bias = torch.zeros_like(logits)
            bias[torch.tensor(FINISH[rank]) == len(calls), :, EOS] = 1e4
            calls.append(1)
            return logits + bias

        handle = model.lm_head.register_forward_hook(finish)
        tokens, _ = sample(model, ids, mask, check_every=check_every, **kwargs)
        handle.remove()
        return tokens, len(calls)

    result = {"lean": lean, "every_step": forced(1), "every_4": forced(4)}
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()  # rank 0 hosts the store: it must not leave while the other rank still needs it
    dist.destroy_process_group()


def test_ranks_finishing_at_different_steps_do_not_deadlock(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.start_processes(run_rank, args=(port, str(tmp_path)), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 120
    try:
        while not context.join(timeout=max(0.0, deadline - time.monotonic())):  # returns as each rank exits
            assert time.monotonic() < deadline, "2 ranks did not finish decoding within 120 s: deadlock"
    finally:
        for p in context.processes:
            if p.is_alive():
                p.terminate()
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for rank, result in enumerate(results):
        for cadence in ("every_step", "every_4"):
            tokens, _ = result[cadence]
            assert tokens.shape[1] == max(FINISH[rank]) + 1, cadence  # each rank trims to its own last EOS
            assert [int(tokens[i, s]) for i, s in enumerate(FINISH[rank])] == [EOS, EOS]
        ids, mask = rank_prompts(rank)  # the lean path gives the unsharded model's greedy tokens
        expected = sample(qwen2(), ids, mask, n=1, max_new_tokens=30, eos_token_ids=[EOS], pad_token_id=PAD,
                          temperature=0.0, lean=False)
        assert torch.equal(result["lean"][0], expected[0])
    # both ranks ran as many forwards (prefill + steps) as the rank that finished last needed: rank 1's
    # last EOS is step 9, so 10 when checking every step; checking every 4 steps, the check at step 12
    assert results[0]["every_step"][1] == results[1]["every_step"][1] == 10
    assert results[0]["every_4"][1] == results[1]["every_4"][1] == 12
