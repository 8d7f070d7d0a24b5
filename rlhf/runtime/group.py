"""`WorkerGroup`: the driver's handle on the workers of one group, whatever the runtime.

`group.generate(batch, sampling)` looks up how `generate` is dispatched (see
rlhf.workers.dispatch), shards or broadcasts the arguments over the ranks, runs the method on
every worker and gathers the results. Subclasses only say how to run one call per rank.

Shards are balanced by token count (rlhf.workers.balance) when the method allows it, the group
has `balance` on (the default) and the Batch has an `attention_mask`: each rank gets the same
number of rows, GRPO groups (adjacent rows with one `uid`) stay on one rank where that keeps
the counts equal, and Batch results come back in the original row order.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from rlhf.batch import Batch
from rlhf.runtime.plan import GroupSpec
from rlhf.workers.balance import balanced_shards
from rlhf.workers.dispatch import dispatch_balance, dispatch_mode
from rlhf.workers.micro_batches import row_tokens, row_units


W = TypeVar("W")  # the worker class of a group


class WorkerGroup(abc.ABC, Generic[W]):
    """Calls worker methods across data-parallel ranks; subclasses implement `_run`.

    `WorkerGroup[PolicyWorker]` names the worker class a group runs. The methods are found by name at
    run time (`__getattr__`); a driver types its group with the worker's group protocol (the policy's:
    `rlhf.workers.policy_group.PolicyGroup`), which states each method's parameters and the group's
    return type, and names the worker method it runs.
    """

    balance = True  # balance sharded calls by token count; set False on a group for contiguous shards
    in_process = False  # whether the workers run in the driver's process (LocalRuntime)

    def __init__(self, spec: GroupSpec, world_size: int):
        self.spec = spec
        self.name = spec.name
        self.world_size = world_size
        self._worker_cls: type[W] = spec.worker_cls

    @abc.abstractmethod
    def _run(self, method: str, per_rank: Sequence[tuple[tuple, dict]]) -> list[Any]:
        """Run `method` on rank r with per_rank[r] = (args, kwargs); results in rank order."""

    def _submit(self, method: str, per_rank: Sequence[tuple[tuple, dict]]) -> list[Any]:
        """Like `_run`, but the results stay where the runtime keeps them (see `deferred`); in-process they are
        the results themselves."""
        return self._run(method, per_rank)

    def deferred(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Per-rank results of an `@on_all_ranks` method, left where the runtime keeps them: another group's
        call takes one as an argument and reads it there (Ray: an object reference the receiving actor
        fetches from the object store, never through the driver; in-process: the object itself). The
        driver does not wait for them; an error surfaces in the call that reads the result."""
        if dispatch_mode(self._worker_cls, method) != "all":
            raise TypeError(f"{self.name}.{method} is sharded: only @on_all_ranks methods can be deferred")
        return self._submit(method, [(args, kwargs)] * self.world_size)

    def shutdown(self) -> None:
        """Release the workers."""

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_"):
            raise AttributeError(method)
        mode = dispatch_mode(self._worker_cls, method)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.call(method, mode, args, kwargs)

        call.__name__ = method
        return call

    def call(self, method: str, mode: str, args: tuple, kwargs: dict) -> Any:
        n = self.world_size
        if mode == "all":
            return self._run(method, [(args, kwargs)] * n)
        if not args or not isinstance(args[0], Batch):
            raise TypeError(f"{self.name}.{method} is sharded: its first argument must be a Batch")
        batch, rest = args[0], args[1:]
        pad = 0
        if mode == "shard":
            batch, pad = batch.pad_to_multiple(n)
        elif len(batch) % n:
            raise ValueError(
                f"{self.name}.{method} got {len(batch)} rows, which do not split evenly over {n} workers "
                f"(padding would train on repeated rows). Make the batch size a multiple of {n}."
            )
        rows = self._shard_rows(batch, n, self.balance and dispatch_balance(self._worker_cls, method))
        shards = [batch.index(r) for r in rows]
        results = self._run(method, [((s, *rest), kwargs) for s in shards])
        if all(isinstance(r, Batch) for r in results):
            return self._gather(method, results, rows, pad)
        return results

    @staticmethod
    def _shard_rows(batch: Batch, n: int, balance: bool) -> list[np.ndarray]:
        """Row indices of each rank's shard: contiguous, or balanced by token count."""
        b = len(batch)
        if not balance or n == 1 or "attention_mask" not in batch.tensors:
            return [np.arange(r * b // n, (r + 1) * b // n) for r in range(n)]
        return balanced_shards(row_tokens(batch).numpy(), n, row_units(batch))

    def _gather(self, method: str, results: list[Batch], rows: list[np.ndarray], pad: int) -> Batch:
        """Concatenated results in the original row order, padding rows dropped.

        A method may return k rows per input row (generate: n samples per prompt, adjacent);
        rank results are then put back in blocks of k.
        """
        sizes = {len(res) / max(len(r), 1) for res, r in zip(results, rows) if len(r)}
        out = Batch.concat(results)
        if len(sizes) != 1 or not float(next(iter(sizes))).is_integer():
            contiguous = all(np.array_equal(r, np.arange(r[0], r[0] + len(r))) for r in rows if len(r))
            if contiguous:  # an aggregate per rank, say: as before balancing existed
                return out.unpad(pad)
            raise ValueError(
                f"{self.name}.{method} returned {[len(r) for r in results]} rows for shards of {[len(r) for r in rows]} "
                "rows; a sharded method whose shards were reordered or padded must return a whole number of rows "
                "per input row. Mark it @shard(balance=False), or return per-row results."
            )
        k = int(next(iter(sizes)))
        dest = (np.concatenate(rows)[:, None] * k + np.arange(k)).reshape(-1)  # where each result row belongs
        out = out.index(np.argsort(dest, kind="stable"))
        return out.unpad(pad * k)
