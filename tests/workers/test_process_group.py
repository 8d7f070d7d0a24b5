"""The process group a worker trains in: gloo on CPUs; on GPUs NCCL and gloo side by side, so that the
collectives on host tensors that FSDP's CPU offload needs (gradient norm, weight gather, engine sync)
have a backend. Initialised by the project from the runtime's variables before Accelerate would
build an NCCL-only group."""

import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.distributed.distributed_c10d import Backend, BackendConfig

from rlhf.workers.fsdp import process_group_backend


@pytest.mark.parametrize("cuda, backend, devices", [
    (False, "gloo", {"cpu": "gloo"}),
    (True, "cpu:gloo,cuda:nccl", {"cpu": "gloo", "cuda": "nccl"}),  # torchtitan's and verl's setting
])
def test_the_backend_has_a_cpu_collective_on_every_machine(cuda, backend, devices):
    assert process_group_backend(cuda) == backend
    parsed = BackendConfig(Backend(backend)).get_device_backend_map()
    assert {device: parsed[device] for device in devices} == devices


def run_rank(script: str) -> str:
    """`script` in a fresh process that is rank 0 of 1, with the variables RayRuntime sets."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


MAKE_AND_REDUCE = """
    import sys
    import torch, torch.distributed as dist
    calls = []  # (who initialised a process group, with which backend)
    real = dist.init_process_group
    def spy(*args, **kwargs):
        calls.append((sys._getframe(1).f_globals["__name__"], kwargs.get("backend")))
        return real(*args, **kwargs)
    dist.init_process_group = spy
    from rlhf.workers.accelerator import make_accelerator
    accelerator = make_accelerator()
    host = torch.ones(3)
    dist.all_reduce(host)  # a collective on a host tensor, as CPU offload's gradient norm
    devices = [host.sum().item()]
    if torch.cuda.is_available():
        gpu = torch.ones(3, device=accelerator.device)
        dist.all_reduce(gpu)
        devices.append(gpu.sum().item())
    print(calls, accelerator.num_processes, dist.get_backend_config(), devices)
"""


def test_a_worker_initialises_its_group_from_the_runtime_variables():
    out = run_rank(MAKE_AND_REDUCE)
    # one group, made by the project (not by Accelerate), and the one Accelerate uses
    assert out.startswith("[('rlhf.workers.fsdp', 'gloo')] 1 cpu:gloo") and out.endswith(" [3.0]")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_group_reduces_host_and_device_tensors():
    out = run_rank(MAKE_AND_REDUCE)
    assert out.startswith("[('rlhf.workers.fsdp', 'cpu:gloo,cuda:nccl')] 1 ") and out.endswith("[3.0, 3.0]")
