"""Decoding with an FSDP2-sharded model on 2 gloo ranks whose rows finish at different steps completes.

A sharded module's own forward all-gathers weights in every step, so a rank that stops early
would leave the other in a collective (reproduced before the all-reduced check: a gloo timeout).
Finished rows leave the batch as decoding goes (rlhf.rollout.decode), which must not make ranks
disagree on the number of sharded forwards. Three paths must complete:
- the model's forward (here forced by a hook): ranks agree on the last step through the all-reduced
  check; a rank drops its finished rows down to 4 (BATCH_INVARIANT_ROWS) and keeps decoding those
  until the other rank is done; with a row cap, prompts come in waves, one prefill each, as many
  on every rank;
- the lean step, which gathers the weights once and runs no collective per step, so each rank drops
  its rows on its own, and gives the unsharded model's tokens;
- the lean step with a row cap: waves again (a prefill is a collective), never refills mid-wave;
  ranks given different numbers of prompts are refused on every rank instead of hanging.
"""

import datetime
import os
import socket
import time

import torch
import torch.multiprocessing as mp

from rlhf.rollout.decode import sample

PAD, EOS = 0, 1
FINISH = {0: [2, 1, 3, 2, 1, 3], 1: [9, 4, 6, 8, 5, 7]}  # per rank, the decoding step at which each row emits EOS
LAST = 12  # a row emits EOS at the step where its position reaches LAST: prompt length LAST - FINISH


def qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)).eval()


def eos_prone():
    """Untied, EOS logit scaled: greedy rows end at different steps without hooks (tests/rollout/test_continuous_batching.py)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False))
    with torch.no_grad():
        model.lm_head.weight[EOS] *= 2.5
    return model.eval()


def rank_prompts(rank):
    """Left-padded prompts of lengths LAST - FINISH[rank]: row i ends at step FINISH[rank][i] under `finish_at_last`."""
    g = torch.Generator().manual_seed(10 + rank)
    lengths = [LAST - s for s in FINISH[rank]]
    width = max(lengths)
    ids = torch.randint(2, 50, (len(lengths), width), generator=g)
    mask = torch.zeros_like(ids)
    for i, length in enumerate(lengths):
        mask[i, width - length :] = 1
    return ids.masked_fill(mask == 0, PAD), mask


def shard(model, mesh):
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def run_rank(rank, port, out_dir):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=datetime.timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (2,))
    model = shard(qwen2(), mesh)
    ids, mask = rank_prompts(rank)
    kwargs = dict(n=1, max_new_tokens=30, eos_token_ids=[EOS], pad_token_id=PAD, temperature=0.0)

    def forced(**options):
        """Rows emit EOS at position LAST (a hook: the model's own forward); (tokens, batch size of each forward)."""
        sizes = []

        def finish_at_last(module, args, kw, out):
            sizes.append(kw["input_ids"].shape[0])
            out.logits[kw["position_ids"][:, -1] >= LAST - 1, -1, EOS] += 1e4
            return out

        handle = model.register_forward_hook(finish_at_last, with_kwargs=True)
        tokens, _ = sample(model, ids, mask, **kwargs, **options)
        handle.remove()
        return tokens, sizes

    result = {"every_step": forced(check_every=1), "every_4": forced(check_every=4),
              "waves": forced(max_rows=2)}
    lean_model = shard(eos_prone(), mesh)  # rows end wherever greedy says: no collective per step
    seed = {0: 37, 1: 30}[rank]  # greedy lengths [4, 1, 3, 2, 2, 2] on rank 0, [11, 1, 2, 4, 4, 19] on rank 1
    lean_ids = torch.randint(2, 50, (6, 8), generator=torch.Generator().manual_seed(seed))
    result["lean"] = sample(lean_model, lean_ids, torch.ones_like(lean_ids), **kwargs)[0]
    result["lean_waves"] = sample(lean_model, lean_ids, torch.ones_like(lean_ids), max_rows=2, **kwargs)[0]
    result["lean_ids"] = lean_ids
    try:  # rank 1 one prompt short: refused on both ranks, not a hang in the next prefill
        sample(lean_model, lean_ids[: 6 - rank], torch.ones_like(lean_ids[: 6 - rank]), max_rows=2, **kwargs)
    except ValueError as err:
        result["unequal"] = str(err)
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
        for how in ("every_step", "every_4", "waves"):
            tokens, _ = result[how]
            assert tokens.shape[1] == max(FINISH[rank]) + 1, how  # each rank trims to its own last EOS
            assert [int(tokens[i, s]) for i, s in enumerate(FINISH[rank])] == [EOS] * 6, how
        ids = result["lean_ids"]  # the lean path gives the unsharded model's greedy tokens
        expected = sample(eos_prone(), ids, torch.ones_like(ids), n=1, max_new_tokens=30, eos_token_ids=[EOS],
                          pad_token_id=PAD, temperature=0.0, lean=False, continuous=False)[0]
        assert torch.equal(result["lean"], expected) and torch.equal(result["lean_waves"], expected)
    assert [r["lean"].shape[1] for r in results] == [4, 19]
    assert all("different numbers of prompts (5 to 6)" in r.get("unequal", "") for r in results)  # the ranks' lean decoding ended at different steps
    every_step = [r["every_step"][1] for r in results]
    # both ranks ran as many forwards (prefill + steps) as the rank that finished last needed: rank 1's last
    # EOS is step 9, so 10 when checking every step; checking every 4 steps, the check at step 12
    assert len(every_step[0]) == len(every_step[1]) == 10
    assert len(results[0]["every_4"][1]) == len(results[1]["every_4"][1]) == 12
    # finished rows left the batch: rank 0's rows all end by step 3, rank 1's from step 4 on; 4 rows stay
    assert every_step[0] == [6, 6, 4, 4] + [4] * 6  # prefill; 2 rows end at step 1, 2 at 2, the rest at 3
    assert every_step[1][:5] == [6] * 5 and every_step[1][5:] == [5, 4, 4, 4, 4]
    # row cap 2: three waves of 2 prompts, each as long on both ranks as its slower rank needs:
    # last EOS at steps max(2, 9), max(3, 8) and max(3, 7), so 10, 9 and 8 forwards (prefill included)
    waves = [r["waves"][1] for r in results]
    assert len(waves[0]) == len(waves[1]) == 10 + 9 + 8
    assert set(waves[0]) == set(waves[1]) == {2}
