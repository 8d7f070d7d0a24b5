"""LocalRuntime frees a stopped group's worker at once, though real workers sit in reference cycles (a model's hooks,
FSDP state, an engine that points back at its worker): otherwise a finished stage's model could still hold the device
while the next stage builds its own (measured on a GPU as one role's memory counted in the next role's peak)."""

import gc
import weakref

import fiddle as fdl

from helpers import tiny_model_path
from rlhf.algos import PPOClipLoss
from rlhf.runtime.local import LocalRuntime
from rlhf.runtime.plan import compile_graph
from rlhf.runtime.remote import Remote
from rlhf.workers.objectives import PolicyObjective
from rlhf.workers.policy import PolicyWorker
from rlhf.workers.training import TrainingSetup
from toy_stages import WriteStage


def test_stopping_the_groups_frees_a_policy_worker_held_in_reference_cycles():
    worker = fdl.Config(PolicyWorker, model_path=tiny_model_path(), training=fdl.Config(TrainingSetup),
                        objective=fdl.Config(PolicyObjective, policy_loss=fdl.Config(PPOClipLoss)))
    plan = compile_graph(fdl.Config(WriteStage, text="x", group=fdl.Config(Remote, worker=worker, name="policy")))
    runtime = LocalRuntime()
    enabled = gc.isenabled()
    gc.disable()  # the collector must not happen to run on its own here
    try:
        group = runtime.start_groups(plan)["policy"]
        alive = weakref.ref(group.worker)
        model = weakref.ref(group.worker.trainer.unwrapped())
        group = None
        assert alive() is not None
        runtime.stop_groups()
        assert alive() is None and model() is None
    finally:
        if enabled:
            gc.enable()
