"""RayRuntime's workers run at the driver's priority, with one torch thread per CPU they were given.

Ray renices its workers by 15 by default: the driver and any other process on their cores (even one at
nice 19 takes 30% of a shared core) then outweigh the processes doing the run's work.
"""

import os

import fiddle as fdl
import pytest

from rlhf.runtime.plan import compile_graph
from rlhf.runtime.ray_runtime import RayRuntime
from rlhf.runtime.remote import Remote
from toy_workers import EchoWorker

DRIVER = os.nice(0)
pytestmark = [pytest.mark.skipif(DRIVER >= 19, reason="at nice 19 every niceness reads 19: run at a lower one"),
              pytest.mark.usefixtures("own_ray_cluster")]  # the niceness is a setting of the cluster's start


def scheduling(runtime: RayRuntime, **remote) -> list[dict]:
    plan = compile_graph(fdl.Config(Remote, worker=fdl.Config(EchoWorker), name="echo", **remote))
    try:
        return runtime.start_groups(plan)["echo"].scheduling()
    finally:
        runtime.shutdown()


def test_workers_run_at_the_drivers_priority_with_one_thread_per_cpu():
    expected = {"niceness": DRIVER, "torch_threads": 1, "omp_num_threads": "1"}
    assert scheduling(RayRuntime(num_cpus=2), num_workers=2) == [expected, expected]


def test_a_worker_gets_the_niceness_and_as_many_threads_as_cpus_asked_for():
    (got,) = scheduling(RayRuntime(num_cpus=2, worker_niceness=3), cpus_per_worker=2)
    assert got == {"niceness": min(19, DRIVER + 3), "torch_threads": 2, "omp_num_threads": "2"}
