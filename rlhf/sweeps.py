"""Sweeps: one experiment graph, N variants, each run as its own set of Aim runs tagged with the sweep.

A sweep is a function of the experiment file that returns the members, one per variant:

    def lr_sweep():
        \"\"\"GRPO learning rates around the default.\"\"\"
        return [{"stages.grpo.policy.worker.optimizer.lr": lr} for lr in (2e-4, 5e-4, 1e-3)]

A member is either

- a dict `{path: value}`: each value is set at its path (the `set:` path syntax, applied with
  `overrides.set_path`, so a misspelled path fails with the valid names); values may be anything
  a graph holds, `fdl.Config(RLOO)` included; or
- a fiddler: a callable `f(graph)` that changes the graph in place (or returns a new one), e.g.
  `functools.partial(workers, n=4)`; it is recorded by its name.

`python experiments/x.py --sweep lr_sweep` (or `--sweep sweep:lr_sweep`, `--sweep 'lr_sweep(k=v)'`)
builds the graph from the rest of the command line, then one copy per member. Every member is
checked before any runs. Each member's runs share the experiment (Aim experiment name) and record
params `sweep.id`, `sweep.name`, `sweep.index`, `sweep.size`, `sweep.label` and `sweep.overrides`
(the member's overrides, nested by path, so Aim groups runs by
`run.params.sweep.overrides.stages.grpo.policy.worker.optimizer.lr`), and the tag `sweep.id`.
A member's checkpoints go to `<output_dir>/sweeps/<sweep id>/<index>/`. Members share one index of
finished upstream stages (`reuse_dir`: the base output folder, `rlhf.runtime.stage_reuse`): a member
whose SFT stage has the graph and data of one that finished, in this sweep or an earlier run there,
takes its checkpoint instead of training it again (members run one after another; parallel members
that start together each run their own).

Members run one after another in this process, or `--sweep_parallel N` at a time, each in its
own Python process that rebuilds the member's graph from its fiddle JSON (the lineage format;
the Aim repo is created first, as several writers need). Parallelism is capped by the CPUs
(and GPUs) the members ask for; GPU members get disjoint `CUDA_VISIBLE_DEVICES`.

From Python (a notebook): `rlhf.sweep(graph, [{"stages.sft.total_steps": s} for s in (5, 10)])`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import secrets
import signal
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import fiddle as fdl
from rich import box
from rich.console import Console
from rich.table import Table

from rlhf.config.overrides import OverrideError, did_you_mean, named_functions, parse_call, parse_path, set_path
from rlhf.config.provenance import labelled
from rlhf.graph.io import from_json, make_experiments_importable, nest, to_json
from rlhf.runtime.experiment import run_experiment
from rlhf.runtime.preflight import (
    PreflightError, batch_table, check_experiment, experiment_resources, gpu_count, preflight_report,
)

__all__ = ["Member", "SweepError", "SweepResults", "expand", "sweep", "sweep_from_cli"]

Override = Mapping[str, Any] | Callable[[Any], Any]


class SweepError(RuntimeError):
    """Some members of a sweep failed; `results` holds every member's results (None where it failed)."""

    def __init__(self, message: str, results: SweepResults):
        super().__init__(message)
        self.results = results


class SweepResults(list):
    """One `run_experiment` result per member, in member order; `.sweep_id`, `.members` too."""

    sweep_id: str = ""
    members: list[Member]


@dataclasses.dataclass
class Member:
    """One variant of the sweep: its graph, what was changed, and the params its runs record."""

    index: int
    graph: fdl.Config
    overrides: dict[str, Any]  # path -> value as given, or {"fiddler": name}
    label: str  # short, for logs and tables: "lr=0.0001"
    params: dict[str, Any]  # {"sweep": {...}}, added to each of its Aim runs

    @property
    def sweep_id(self) -> str:
        return self.params["sweep"]["id"]


def new_sweep_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def expand(
    base: fdl.Config, members: Iterable[Override], *, name: str = "sweep", sweep_id: str | None = None
) -> list[Member]:
    """One graph per member: a deep copy of `base` with the member applied (recorded in the argument
    history as `sweep:NAME[i]`), its own output folder, and its sweep params."""
    members = list(members)
    if not members:
        raise OverrideError(f"sweep {name!r} has no members")
    sweep_id = sweep_id or new_sweep_id(name)
    out = []
    for index, member in enumerate(members):
        graph = copy.deepcopy(base)
        # A dict member's values are labelled `sweep:NAME[i]`; a fiddler's also name its file:line.
        with labelled(f"sweep:{name}[{index}]", with_caller=callable(member) and not isinstance(member, Mapping)):
            if isinstance(member, Mapping):
                for path, value in member.items():
                    set_path(graph, path, value)
                overrides = dict(member)
            elif callable(member):
                result = member(graph)
                graph = result if result is not None else graph
                overrides = {"fiddler": _callable_name(member)}
            else:
                raise OverrideError(
                    f"sweep {name!r}: member {index} is a {type(member).__name__}; a member is a dict "
                    "{path: value} or a fiddler (a function of the graph)"
                )
            if isinstance(graph, fdl.Buildable) and "output_dir" in graph.__signature_info__.parameters:
                arguments = fdl.ordered_arguments(graph, include_defaults=True)
                graph.output_dir = str(Path(arguments["output_dir"]) / "sweeps" / sweep_id / str(index))
                if "reuse_dir" in arguments and arguments["reuse_dir"] is None:  # members share finished stages
                    graph.reuse_dir = arguments["output_dir"]
                if arguments.get("reuse_upstream", False) is None:
                    graph.reuse_upstream = True
        label = _label(overrides)
        params = {
            "sweep": {
                "id": sweep_id,
                "name": name,
                "index": index,
                "size": len(members),
                "label": label,
                "overrides": _nested_overrides(overrides),
            }
        }
        out.append(Member(index, graph, overrides, label, params))
    return out


def sweep(
    base_graph: fdl.Config,
    members: Iterable[Override],
    parallel: int = 1,
    *,
    name: str = "sweep",
    stages: Sequence[str] | None = None,
    overrides: Sequence[str] = (),
    fiddlers: Sequence[str] = (),
) -> SweepResults:
    """Run one experiment per member of the sweep; returns each member's `run_experiment` results.

    Args:
      base_graph: an Experiment graph; it is not modified.
      members: dicts `{path: value}` and/or fiddlers (see the module docstring).
      parallel: members run at once, each in its own process (1: one after another, here).
      name: the sweep's name (Aim param `sweep.name`; the id is `NAME-<time>-<random>`).
      stages: the stages to run (None: all).
      overrides, fiddlers: the command line the base graph came from, recorded with each run.

    Raises:
      PreflightError: a member cannot start (nothing has run).
      SweepError: some members failed after the others finished; `.results` has the rest.
    """
    return run_members(expand(base_graph, members, name=name), parallel, stages=stages, overrides=overrides,
                       fiddlers=fiddlers)


def run_members(
    members: Sequence[Member],
    parallel: int = 1,
    *,
    stages: Sequence[str] | None = None,
    overrides: Sequence[str] = (),
    fiddlers: Sequence[str] = (),
) -> SweepResults:
    problems, reports = [], [preflight_report(m.graph, stages) for m in members]
    for m, report in zip(members, reports):
        problems += [f"- member {m.index} ({m.label}): {p}" for p in report.errors]
    if problems:
        raise PreflightError("the sweep cannot start:\n" + "\n".join(problems))
    sweep_id = members[0].sweep_id
    print(f"sweep {sweep_id}: {len(members)} members")
    previous = None
    for m, report in zip(members, reports):
        table = batch_table(report.batches) if report.batches else ""
        print(f"  [{m.index}] {m.label}" + (f"\n{_indent(table)}" if table and table != previous else ""))
        previous = table
    _create_tracking_repo(members[0].graph)
    jobs = _parallelism(members, parallel, stages)
    if jobs <= 1:
        results = _run_here(members, stages, overrides, fiddlers)
    else:
        results = _run_in_processes(members, jobs, stages, overrides, fiddlers)
    out = SweepResults(results)
    out.sweep_id, out.members = sweep_id, list(members)
    failed = [m for m, r in zip(members, results) if r is None]
    print(format_sweep(members, results))
    if failed:
        raise SweepError(
            f"sweep {sweep_id}: {len(failed)} of {len(members)} members failed: "
            + ", ".join(f"[{m.index}] {m.label}" for m in failed),
            out,
        )
    return out


def sweep_from_cli(
    namespaces: Sequence[types.ModuleType],
    graph: fdl.Config,
    spec: str,
    *,
    parallel: int = 1,
    stages: Sequence[str] | None = None,
    overrides: Sequence[str] = (),
    fiddlers: Sequence[str] = (),
    dry_run: bool = False,
) -> SweepResults | list[Member]:
    """`--sweep NAME`: call the sweep function NAME(**kwargs) of the experiment, run its members."""
    name, members = sweep_members(namespaces, spec)
    expanded = expand(graph, members, name=name)
    if dry_run:
        previous = None
        for m in expanded:
            report = check_experiment(m.graph, stages)
            table = batch_table(report.batches) if report.batches else ""
            print(f"[{m.index}] {m.label}" + (f"\n{_indent(table)}" if table and table != previous else ""))
            previous = table
            for e in report.errors:
                print(f"  error: {e}")
        return expanded
    return run_members(expanded, parallel, stages=stages, overrides=[*overrides, f"sweep:{spec}"], fiddlers=fiddlers)


def sweep_members(namespaces: Sequence[types.ModuleType], spec: str) -> tuple[str, list[Override]]:
    """(name, members) of `sweep:NAME(k=v)` / `NAME`, looked up like fiddlers."""
    body = spec.removeprefix("sweep:")
    name, kwargs = parse_call(body, "sweep")
    functions = named_functions(namespaces)
    if name not in functions:
        sweeps = [n for n, f in functions.items() if n.endswith("sweep")] or list(functions)
        raise OverrideError(f"no sweep function {name!r}." + did_you_mean(name, sweeps))
    members = functions[name](**kwargs)
    if isinstance(members, (Mapping, str)) or not isinstance(members, Iterable):
        raise OverrideError(
            f"sweep {name!r} returned a {type(members).__name__}; a sweep returns a list (or generator) of members: "
            "dicts {path: value} or fiddlers"
        )
    return name, list(members)


def format_sweep(members: Sequence[Member], results: Sequence[Mapping[str, Any] | None]) -> str:
    """A table: one row per member with its label, its runs and the last stage's headline metrics."""
    title = f"sweep {members[0].sweep_id}" if members else "sweep"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    metric_names = sorted({k for r in results if r for s in r.values() for k in s.get("metrics", {})
                           if k.startswith("val-core/")})
    for column in ("#", "member", "aim runs", *[m.removeprefix("val-core/") for m in metric_names]):
        table.add_column(column)
    for m, r in zip(members, results):
        if r is None:
            table.add_row(str(m.index), m.label, "FAILED", *["" for _ in metric_names])
            continue
        runs = ", ".join(f"{stage} {s.get('run_hash') or '-'}" for stage, s in r.items())
        last = {}
        for s in r.values():
            last.update(s.get("metrics", {}))
        table.add_row(str(m.index), m.label, runs, *[f"{last[k]:.3f}" if k in last else "" for k in metric_names])
    console = Console(width=160, record=True, file=open(os.devnull, "w"))
    console.print(table)
    return "\n".join(line.rstrip() for line in console.export_text().rstrip().splitlines())


# --------------------------------------------------------------------------- running
def _run_here(members, stages, overrides, fiddlers) -> list[dict | None]:
    results: list[dict | None] = []
    for m in members:
        print(f"sweep {m.sweep_id}: member {m.index} ({m.label})", flush=True)
        try:
            results.append(run_experiment(m.graph, overrides=overrides, fiddlers=fiddlers, stages=stages,
                                          run_params=m.params, tags=[m.sweep_id]))
        except Exception as err:  # noqa: BLE001 - one failed member does not stop the others
            print(f"sweep {m.sweep_id}: member {m.index} ({m.label}) failed: {type(err).__name__}: {err}", flush=True)
            results.append(None)
    return results


def _run_in_processes(members, jobs, stages, overrides, fiddlers) -> list[dict | None]:
    gpu_slots = _gpu_slots(members, jobs, stages)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([os.getcwd(), *[p for p in sys.path if p]]))
    results: list[dict | None] = [None] * len(members)
    pending = list(members)
    running: dict[int, tuple[subprocess.Popen, Member, Path, Any, list[str] | None]] = {}
    print(f"sweep {members[0].sweep_id}: {jobs} members at a time, each in its own process", flush=True)
    try:
        while pending or running:
            while pending and len(running) < jobs:
                m = pending.pop(0)
                folder = Path(fdl.ordered_arguments(m.graph, include_defaults=True)["output_dir"])  # per member
                folder.mkdir(parents=True, exist_ok=True)
                spec = {
                    "graph_json": to_json(m.graph),
                    "overrides": list(overrides),
                    "fiddlers": list(fiddlers),
                    "stages": list(stages) if stages is not None else None,
                    "run_params": m.params,
                    "tags": [m.sweep_id],
                    "result_path": str((folder / "results.json").absolute()),
                }
                (folder / "member.json").write_text(json.dumps(spec))
                slot = gpu_slots.pop(0) if gpu_slots else None
                child_env = dict(env, CUDA_VISIBLE_DEVICES=",".join(slot)) if slot is not None else env
                log = open(folder / "member.log", "w")
                proc = subprocess.Popen(
                    [sys.executable, "-m", "rlhf.sweeps", str(folder / "member.json")],
                    stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True,
                )
                running[m.index] = (proc, m, folder, log, slot)
                print(f"sweep {m.sweep_id}: member {m.index} ({m.label}) started; log {folder / 'member.log'}",
                      flush=True)
            time.sleep(0.2)
            for index, (proc, m, folder, log, slot) in list(running.items()):
                if proc.poll() is None:
                    continue
                log.close()
                del running[index]
                if slot is not None:
                    gpu_slots.append(slot)
                if proc.returncode == 0 and (folder / "results.json").exists():
                    results[index] = json.loads((folder / "results.json").read_text())
                    print(f"sweep {m.sweep_id}: member {index} ({m.label}) finished", flush=True)
                else:
                    tail = "\n".join((folder / "member.log").read_text(errors="replace").splitlines()[-15:])
                    print(f"sweep {m.sweep_id}: member {index} ({m.label}) failed (exit {proc.returncode}); "
                          f"end of {folder / 'member.log'}:\n{_indent(tail)}", flush=True)
    finally:
        for proc, *_ in running.values():  # Ctrl-C: each member closes its runs as interrupted
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc, _, _, log, _ in running.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
    return results


def _parallelism(members: Sequence[Member], parallel: int, stages: Sequence[str] | None) -> int:
    """`parallel`, capped by the members and by what the machine can run at once."""
    jobs = max(1, min(int(parallel), len(members)))
    if jobs == 1:
        return 1
    cpus, gpus = zip(*(dataclasses.astuple(experiment_resources(m.graph, stages)) for m in members))
    by_cpu = max(1, (os.cpu_count() or 1) // max(1, math.ceil(max(cpus))))
    capped = min(jobs, by_cpu)
    if max(gpus) > 0:
        capped = min(capped, max(1, gpu_count() // math.ceil(max(gpus))))
    if capped < jobs:
        print(f"sweep: running {capped} members at a time instead of {jobs}: each asks for up to {max(cpus):g} CPUs "
              f"and {max(gpus):g} GPUs, this machine has {os.cpu_count()} CPUs")
    return capped


def _gpu_slots(members, jobs, stages) -> list[list[str]]:
    gpus = max(experiment_resources(m.graph, stages).gpus for m in members)
    if gpus <= 0:
        return []
    per = math.ceil(gpus)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range(gpu_count())]
    return [devices[i * per:(i + 1) * per] for i in range(min(jobs, len(devices) // per))]


def _create_tracking_repo(graph: Any) -> None:
    """Build the tracker once here: it creates the Aim repo before several processes write to it."""
    if not isinstance(graph, fdl.Buildable):
        return
    tracker = fdl.ordered_arguments(graph, include_defaults=True).get("tracker")
    if isinstance(tracker, fdl.Buildable):
        fdl.build(tracker)


# --------------------------------------------------------------------------- params
def _callable_name(fn: Any) -> str:
    if hasattr(fn, "func"):  # functools.partial
        args = ", ".join(f"{k}={v!r}" for k, v in fn.keywords.items())
        return f"{_callable_name(fn.func)}({args})"
    return getattr(fn, "__name__", repr(fn))


def _describe(value: Any) -> Any:
    """A value Aim can store and group by: primitives as they are, anything else as short text."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in value):
        return list(value)
    if isinstance(value, fdl.Buildable):
        fn = fdl.get_callable(value)
        args = ", ".join(f"{k}={_describe(v)!r}" for k, v in value.__arguments__.items())
        return f"{getattr(fn, '__name__', fn)}({args})"
    if callable(value):
        return _callable_name(value)
    return repr(value)


def _nested_overrides(overrides: Mapping[str, Any]) -> dict:
    flat = {}
    for path, value in overrides.items():
        keys = parse_path(path) if path != "fiddler" else ["fiddler"]
        flat[".".join(str(k) for k in keys)] = _describe(value)
    return nest(flat)


def _label(overrides: Mapping[str, Any]) -> str:
    parts = []
    for path, value in overrides.items():
        if path == "fiddler":
            parts.append(str(value))
            continue
        key = str(parse_path(path)[-1])
        parts.append(f"{key}={value!r}" if isinstance(value, str) else f"{key}={_describe(value)}")
    return ", ".join(parts) or "(base)"


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())


# --------------------------------------------------------------------------- child process
def _member_main(spec_path: str) -> int:
    """Run one member from its spec (written by `_run_in_processes`)."""
    make_experiments_importable()
    spec = json.loads(Path(spec_path).read_text())
    results = run_experiment(
        from_json(spec["graph_json"]),
        overrides=spec["overrides"],
        fiddlers=spec["fiddlers"],
        stages=spec["stages"],
        run_params=spec["run_params"],
        tags=spec["tags"],
    )
    Path(spec["result_path"]).write_text(json.dumps(results, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(_member_main(sys.argv[1]))
