"""The preflight: every check of an experiment graph before anything starts; each message says what to change.

One mechanism, one entry point: `preflight(graph, stages)` raises one `PreflightError` listing
every problem (and logs the warnings), or returns the `Report`. The experiment runner
(`rlhf.runtime.experiment.run_experiment`) calls it before any stage starts, so every way of
running a graph is checked; callers may run it earlier to stop sooner (`--print_plan`, a sweep
checking all its members before the first runs). `preflight_report` gives the same problems
without raising (a sweep labels them by member).

What it checks, in the stages that will run:

- every configured value against its parameter's annotation and range markers
  (`rlhf.graph.typecheck`; `Annotated[int, Positive]` from `rlhf.ranges`); the other checks
  run only on a well-typed graph;
- required arguments that are not set (a `fdl.Config` whose callable needs an argument the
  graph does not give; a `fdl.Partial` may leave arguments to its caller);
- resources the machine cannot give: GPUs asked for where there are none, more CPUs than a
  local Ray cluster has;
- data-flow contradictions: an advantage estimator that needs a critic in a trainer without
  one, a KL loss with no reference model, a group estimator (GRPO, RLOO, ...) with one sample
  per prompt, a stage using the output of a stage that does not run before it;
- batch arithmetic that does not divide: samples per step over the data-parallel workers
  (`PolicyWorker.update` is `@shard_exact`: a padded row would train twice), each worker's
  rows over its mini-batches. Micro-batches that do not divide are only a warning (they change
  memory use, not the update);
- for a named run that exists, the graph against the one it was started with
  (`rlhf.runtime.run_record`);
- the components' own `preflight` hooks (`rlhf.runtime.preflight_hooks`: missing model folder
  or data file, bad rows);
- every `data_source` of an RL stage's training rows and of an evaluator's rows against the
  reward's scorers (the trainer checks the same when it is built, but that is after the models
  load). Rows that come from an earlier stage or a stream are left to the trainer;
- peak memory per role and device, predicted from the model configs before any weight loads
  (each worker class's `predict_memory`): a device whose colocated roles do not fit is refused,
  naming the largest consumers and the settings that would fit (docs/memory.md).

`check_experiment(graph, stages)` is the graph part alone (no hooks, no run record, no memory
plan: cheap and without reading files); `batch_table(batches)` is the batch arithmetic per
RL/SFT stage, printed at start-up; `memory_table(plans)` is the memory plan (`--print_plan`).

One job per module: `checks` (the runner and its report), `graph` (walking the unbuilt graph),
`batches` (batch arithmetic), `resources` (CPUs and GPUs held at once: the sum a sweep uses
too), `data_flow` (data-flow and stage-order rules), `memory` (the memory planner).
"""


from rlhf.runtime.preflight.batches import BatchArithmetic, batch_table
from rlhf.runtime.preflight.checks import (
    PreflightError, Report, batch_arithmetic, check_experiment, preflight, preflight_report,
)
from rlhf.runtime.preflight.graph import runtime_kind
from rlhf.runtime.preflight.memory import MemoryPlan, memory_table
from rlhf.runtime.preflight.resources import Resources, experiment_resources, gpu_count, stage_resources

__all__ = [
    "BatchArithmetic",
    "MemoryPlan",
    "PreflightError",
    "Report",
    "Resources",
    "batch_arithmetic",
    "batch_table",
    "check_experiment",
    "experiment_resources",
    "gpu_count",
    "memory_table",
    "preflight",
    "preflight_report",
    "runtime_kind",
    "stage_resources",
]
