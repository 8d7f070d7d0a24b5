"""The torch.distributed environment of each rank of a group, from where its actor landed.

Ray places the actors first; each reports its node (`ActorSite`) and rank 0 also a free
port on its own node. Then every rank gets the variables torchrun would have set:

- `MASTER_ADDR`/`MASTER_PORT`: rank 0's node address and that port (not the driver's: on a
  cluster the driver may be on another machine, or outside it);
- `RANK`, `WORLD_SIZE`: the group's data-parallel rank and size;
- `LOCAL_RANK`, `LOCAL_WORLD_SIZE`: the rank's index among the group's ranks on the same
  node (in rank order) and how many there are;
- `CUDA_VISIBLE_DEVICES`: when every rank on a node holds exactly one GPU of its own, all of
  them see the node's GPUs of the group in local-rank order, so `cuda:LOCAL_RANK` is the
  rank's own GPU, as under torchrun (Accelerate, `init_device_mesh` and NCCL barriers index
  devices by `LOCAL_RANK`; Ray Train shares devices on a node the same way). Otherwise (no
  GPU, several ranks on one GPU, several GPUs per rank) Ray's per-actor setting stays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class ActorSite:
    """Where one actor runs, as it reports it from inside."""

    node_id: str  # Ray's node id: ranks with one node_id share a machine
    node_ip: str
    gpu_ids: tuple[str, ...] = ()  # the GPUs Ray assigned to this actor
    port: int | None = None  # a free port on its node (asked of rank 0 only)


def local_ranks(node_ids: Sequence[str]) -> list[tuple[int, int]]:
    """(LOCAL_RANK, LOCAL_WORLD_SIZE) per rank: ranks on one node numbered 0..k-1 in rank order."""
    seen: dict[str, int] = {}
    index = []
    for node in node_ids:
        index.append(seen.get(node, 0))
        seen[node] = index[-1] + 1
    return [(i, seen[node]) for i, node in zip(index, node_ids)]


def distributed_env(sites: Sequence[ActorSite]) -> list[dict[str, str]]:
    """Environment variables of each rank (rank r is sites[r]; sites[0].port must be set)."""
    if not sites or sites[0].port is None:
        raise ValueError("rank 0 must report a free port on its node for MASTER_PORT")
    ranks = local_ranks([s.node_id for s in sites])
    envs = []
    for rank, (site, (local_rank, local_size)) in enumerate(zip(sites, ranks)):
        envs.append({
            "MASTER_ADDR": sites[0].node_ip,
            "MASTER_PORT": str(sites[0].port),
            "RANK": str(rank),
            "WORLD_SIZE": str(len(sites)),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_size),
        })
    for node in dict.fromkeys(s.node_id for s in sites):
        on_node = [r for r, s in enumerate(sites) if s.node_id == node]
        ids = [sites[r].gpu_ids for r in on_node]
        if all(len(i) == 1 for i in ids) and len({i[0] for i in ids}) == len(ids):
            visible = ",".join(i[0] for i in ids)  # in local-rank order: cuda:LOCAL_RANK is the rank's own GPU
            for r in on_node:
                envs[r]["CUDA_VISIBLE_DEVICES"] = visible
    return envs
