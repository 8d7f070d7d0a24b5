"""Is on-policy distillation cheaper than RL? One student trained three ways from the same start, against one teacher.

    OMP_NUM_THREADS=1 python benchmarks/distillation.py --out benchmarks/results     # the full comparison
    python benchmarks/distillation.py --teacher path/to/teacher                      # a teacher you have
    python benchmarks/distillation.py --quick                                        # the harness on the tiny model

The task is `experiments/smollm2_tasks.py`'s arithmetic (our generator; "The answer is N." asked for). The teacher
is SmolLM2-135M-Instruct after `--teacher-steps` GRPO steps of that recipe, built once and cached
(`--teacher-cache`; its folder holds `teacher.json`: how it was made and its held-out accuracy), or `--teacher`.
The student starts from SmolLM2-135M-Instruct each time and is trained by:

- **opd**: `experiments/smollm2_distill.py` (the recipe's stage with the advantage the per-token reverse KL to the
  teacher, both scored at the sampling temperature), `--opd-steps` steps;
- **grpo**: `experiments/smollm2_tasks.py` unchanged (the task reward, GRPO), `--grpo-steps` steps;
- **sft**: sequence-level distillation (Kim & Rush 2016): the teacher answers `--sft-prompts` training prompts
  (`rlhf generate`'s stage, greedy unless `--sft-temperature`), and our SFT stage trains the student on those
  answers for `--sft-steps` batches of `--sft-batch`.

Every method validates on the recipe's 200 held-out rows (greedy, 64 new tokens) every `--eval-every` steps and at
its end. Accuracy is `--metric`: "lenient" (the right number, the form aside: the teacher the task recipe makes
answers right in its own words, 6% -> 61% lenient but 0% -> 1.5% strict in its measured run, so strict accuracy
would compare nothing) or "strict". Minutes are training time: the steps' own time (validation excluded), plus
for sft the teacher's sampling. `minutes_to_90pct_teacher` is the training time at the first validation at or
above 0.9 x the teacher's accuracy (resolution: the validation cadence), null if none reached it.

Each method runs in a fresh process (LocalRuntime, no Aim, one thread), one after another (`--parallel 1`: the
timings are comparable only without a neighbour). Writes `distillation-<time>.json` into `--out` (default: a
temporary folder) with top-level `teacher_accuracy`, `student_base_accuracy` and `methods` {opd, grpo, sft}, each
with `final_accuracy`, `minutes_to_90pct_teacher` and `curve`, plus the settings (sampling temperature, KL
estimator, learning rates) and whether OPD met the target (at most a third of GRPO's time to 90% of the teacher,
or GRPO never reaching it while OPD does).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from scratch import report_pruned  # noqa: E402
from transfer import CurveTracker  # noqa: E402  the in-memory tracker of a child's only run

DEFAULT_CACHE = Path("~/.cache/rlhf/teachers").expanduser()
STUDENT = "smollm2-135m-instruct"
METHODS = ("opd", "grpo", "sft")
METRICS = {"strict": "val-core/arithmetic/reward/mean@1", "lenient": "val-aux/arithmetic/lenient/mean@1"}
TARGET_RATIO = 1 / 3  # OPD's minutes to 90% of the teacher, at most this fraction of GRPO's


# ------------------------------------------------------------------ settings

def recipe_temperature() -> float:
    """The sampling temperature every method runs at: experiments/smollm2_tasks.py's default."""
    import inspect

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import smollm2_tasks

    return inspect.signature(smollm2_tasks.base).parameters["temperature"].default


def recipe_samples() -> dict[str, int]:
    """Answers sampled per prompt by each method's recipe: GRPO's groups (smollm2_tasks), OPD's (smollm2_distill)."""
    import inspect

    return {"grpo": 8, "opd": inspect.signature(_recipe("smollm2_distill").base).parameters["samples_per_prompt"].default}


def _recipe_default(name: str):
    """A default of `smollm2_distill.base` (the OPD recipe)."""
    import inspect

    return inspect.signature(_recipe("smollm2_distill").base).parameters[name].default


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What each child runs with (also written into the result)."""
    quick = args.quick
    return {
        "student": args.student or ("tiny" if quick else STUDENT),
        "metric": args.metric, "heldout_rows": 8 if quick else 200,
        "teacher_steps": 2 if quick else args.teacher_steps,
        "opd": {"steps": 2 if quick else args.opd_steps, "lr": args.opd_lr, "distill_coef": args.distill_coef,
                "samples_per_prompt": args.opd_samples,
                "top_k": args.top_k if args.top_k is not None else _recipe_default("top_k")},
        "grpo": {"steps": 2 if quick else args.grpo_steps, "lr": args.grpo_lr},
        "sft": {"steps": 2 if quick else args.sft_steps, "batch": 4 if quick else args.sft_batch, "lr": args.sft_lr,
                "prompts": 8 if quick else args.sft_prompts, "temperature": args.sft_temperature},
        "eval_every": 1 if quick else args.eval_every,
        "sampling": {"temperature": recipe_temperature(), "n": 2 if quick else None,  # None: each recipe's own
                     "n_per_method": None if quick else {**recipe_samples(),
                                                         **({"opd": args.opd_samples} if args.opd_samples else {})},
                     "prompts_per_step": 2 if quick else 8, "max_new_tokens": 8 if quick else 64},
        "kl_estimator": "k1 (log pi - log mu, the advantage negated; no KL to a reference)",
        "seed": args.seed,
    }


# ------------------------------------------------------------------ graphs (children)
def _recipe(name: str):
    from rlhf.cli.experiment import load_experiment

    return load_experiment(str(ROOT / "experiments" / f"{name}.py"))


def _student_path(s: dict, workdir: Path) -> str:
    """The student's model folder: SmolLM2 (imported once into the cache) or, for --quick, a tiny local model."""
    if s["student"] == "tiny":
        from rlhf.models.tiny import tiny_qwen2

        return tiny_qwen2(str(workdir / "tiny-student-h64-l2"), hidden_size=64, num_layers=2)
    from rlhf.models.importing import model_folder

    return model_folder(s["student"])


def _shrink(stage, s: dict) -> None:
    """The run's sampling and held-out sizes on an RL stage of the recipe (--quick makes them tiny)."""
    from rlhf_configs.rows import limit_rows

    sampling = s["sampling"]
    if sampling["n"] is not None:  # --quick; else each recipe's own (OPD needs no group baseline: fewer samples)
        stage.sampling.n = sampling["n"]
    stage.prompts_per_step = sampling["prompts_per_step"]
    stage.sampling.max_new_tokens = stage.evaluator.sampling.max_new_tokens = sampling["max_new_tokens"]
    limit_rows(stage.evaluator.dataset, s["heldout_rows"])
    stage.val_before_train = False
    stage.records = None
    stage.save_freq = 0


def _run(stages: dict, out: Path) -> dict:
    """Run `stages` in this process (LocalRuntime, untracked, quiet); the stages' results."""
    import fiddle as fdl

    from rlhf.runtime.experiment import Experiment, run_experiment
    from rlhf.runtime.local import LocalRuntime

    graph = fdl.Config(Experiment, name="distillation_benchmark", stages=stages, runtime=fdl.Config(LocalRuntime),
                       tracker=fdl.Config(CurveTracker), output_dir=str(out), progress=False)
    return run_experiment(graph)


def rl_stage(method: str, s: dict, student: str, teacher: str | None):
    """The RL stage of `method` ("opd", "grpo", or "teacher": the GRPO recipe that makes the teacher)."""
    tasks = _recipe("smollm2_tasks")
    steps = s["teacher_steps"] if method == "teacher" else s[method]["steps"]
    if method == "opd":
        given = {"samples_per_prompt": s["opd"].get("samples_per_prompt"), "top_k": s["opd"].get("top_k")}
        cfg = _recipe("smollm2_distill").base(teacher=teacher, student=student, steps=steps, lr=s["opd"]["lr"],
                                              distill_coef=s["opd"]["distill_coef"],
                                              **{k: v for k, v in given.items() if v is not None})  # else the recipe's
        stage = cfg.stages["distill"]
    else:
        lr = s["grpo"]["lr"] if method == "grpo" else 2e-5
        stage = tasks.base(task="arithmetic", model=student, steps=steps, lr=lr).stages["grpo"]
    stage.evaluator = evaluator_node(s, student)  # every method's curve on the same test rows
    _shrink(stage, s)
    stage.test_freq = s["eval_every"] if method != "teacher" else 0
    if method != "teacher":  # the prompts' order and the sampling's random numbers; the teacher stays the same
        stage.seed = s.get("seed", 0)
    return stage


def evaluator_node(s: dict, student: str):
    """The held-out evaluator every method validates with: the task recipe's test rows (its validation rows pick
    `best/`; here every method's curve is read on the same test rows)."""
    cfg = _recipe("smollm2_tasks").base(task="arithmetic", model=student)
    stage = cfg.stages["grpo"]
    stage.evaluator = cfg.stages["test"].evaluator
    _shrink(stage, s)
    return stage.evaluator


def build_teacher(s: dict, student: str, folder: Path, workdir: Path) -> dict:
    """GRPO with the task recipe for `teacher_steps` steps, its final weights copied to `folder`; its record."""
    CurveTracker.curve = []
    started = time.perf_counter()
    result = _run({"teacher": rl_stage("teacher", s, student, None)}, workdir / "teacher")["teacher"]
    metrics = result["metrics"]
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(result["checkpoint"], tmp)
    record = {
        "made_by": f"experiments/smollm2_tasks.py config:base(task='arithmetic', steps={s['teacher_steps']}) from "
                   f"{s['student']}, via benchmarks/distillation.py",
        "steps": s["teacher_steps"], "minutes": round((time.perf_counter() - started) / 60, 2),
        "heldout": {name: metrics.get(key) for name, key in METRICS.items()}, "heldout_rows": s["heldout_rows"],
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    (tmp / "teacher.json").write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return record


def evaluate(model: str, s: dict, student: str) -> dict[str, float]:
    """Held-out accuracy of the model folder `model` (both metrics), with the methods' own evaluator."""
    import fiddle as fdl

    from rlhf.runtime.local import LocalRuntime
    from rlhf.runtime.plan import bind_groups, compile_graph
    from rlhf_configs.pieces import policy_group

    graph = fdl.Config(Evaluation, policy=policy_group(model_path=model), evaluator=evaluator_node(s, student))
    plan = compile_graph(graph)
    runtime = LocalRuntime()
    groups = runtime.start_groups(plan)
    try:
        metrics = fdl.build(bind_groups(plan.driver, groups)).run()
    finally:
        runtime.stop_groups()
    return {name: metrics[key] for name, key in METRICS.items()}


class Evaluation:
    """A policy group and an evaluator: the held-out metrics of the group's model."""

    def __init__(self, policy, evaluator):
        self.policy, self.evaluator = policy, evaluator

    def run(self) -> dict[str, float]:
        return self.evaluator(self.policy)


def sft_rows(s: dict, teacher: str, workdir: Path) -> tuple[Path, float]:
    """The teacher's answers to the first `prompts` training prompts as SFT rows (the response in
    extra_info["teacher_response"]); (their parquet file, the sampling's minutes)."""
    import fiddle as fdl

    from rlhf.data.files import read_rows, write_rows
    from rlhf.data.generators import arithmetic_rows
    from rlhf.runtime.experiment import Experiment, run_experiment
    from rlhf.runtime.local import LocalRuntime
    from rlhf_configs.generate_eval import generation_stage

    tasks = _recipe("smollm2_tasks")
    prompts = workdir / "sft-prompts.parquet"
    write_rows(tasks.with_instruction(arithmetic_rows(n=s["sft"]["prompts"], seed=0, split="train")), prompts)
    out = workdir / "teacher-samples.jsonl"
    sampling = s["sampling"]
    stage = generation_stage(teacher, str(prompts), str(out), n=1, temperature=s["sft"]["temperature"], top_p=1.0,
                             max_new_tokens=sampling["max_new_tokens"], batch_size=64,
                             max_prompt_length=tasks.MAX_PROMPT_LENGTH, workers=1, gpus_per_worker=0,
                             dtype="float32", parent_run=None, engine="hf", kind="prompt")
    started = time.perf_counter()
    run_experiment(fdl.Config(Experiment, name="teacher_samples", stages={"generate": stage},
                              runtime=fdl.Config(LocalRuntime), tracker=None, output_dir=str(workdir / "gen"),
                              progress=False))
    minutes = (time.perf_counter() - started) / 60
    rows = [{k: v for k, v in row.items() if k not in ("responses", "response_lengths", "generation_settings",
                                                        "row_index", "prompt_length", "scores")}
            | {"extra_info": {**(row.get("extra_info") or {}), "teacher_response": row["responses"][0]}}
            for row in read_rows(str(out.with_suffix(".parquet")))[0]]
    path = workdir / "sft-teacher-samples.parquet"
    write_rows(rows, path)
    return path, minutes


def sft_stage(s: dict, student: str, data: Path):
    """Our SFT stage on the teacher's answers, validated like the RL methods."""
    from rlhf_configs.sft import sft_stage as make

    tasks = _recipe("smollm2_tasks")
    steps = s["sft"]["steps"]
    stage = make(student, str(data), steps=steps, batch_size=s["sft"]["batch"], micro_batch_size=s["sft"]["batch"],
                 lr=s["sft"]["lr"], warmup_steps=max(1, steps // 10), max_length=tasks.MAX_PROMPT_LENGTH + 96,
                 response_key="teacher_response", test_freq=s["eval_every"])
    stage.evaluator = evaluator_node(s, student)
    return stage


def run_method(method: str, s: dict, teacher: str, workdir: Path) -> dict:
    """One method in this process: its curve (training minutes, held-out accuracy) and final accuracy."""
    CurveTracker.curve = []
    student = _student_path(s, workdir)
    offset = 0.0  # minutes spent before training (sft: the teacher's sampling)
    if method == "sft":
        data, offset = sft_rows(s, teacher, workdir)
        stages = {"sft": sft_stage(s, student, data)}
    else:
        stages = {method: rl_stage(method, s, student, teacher)}
    started = time.perf_counter()
    _run(stages, workdir / method)
    wall = (time.perf_counter() - started) / 60 + offset
    curve, train_s = [], 0.0
    for point in CurveTracker.curve:
        train_s += point.get("timing_s/step", 0.0)
        if METRICS["strict"] in point:
            curve.append({"step": point["step"], "minutes": round(offset + train_s / 60, 3),
                          **{name: round(point[key], 4) for name, key in METRICS.items() if key in point}})
    return {"curve": curve, "train_minutes": round(offset + train_s / 60, 3), "wall_minutes": round(wall, 2),
            "sampling_minutes": round(offset, 3) if method == "sft" else None,
            "steps": sum(1 for p in CurveTracker.curve if "timing_s/step" in p),
            "training_score": [round(p["critic/score/mean"], 4) for p in CurveTracker.curve
                               if "critic/score/mean" in p],
            "reverse_kl": [round(p["distill/reverse_kl"], 4) for p in CurveTracker.curve if "distill/reverse_kl" in p]}


# ------------------------------------------------------------------ bookkeeping (pure)
def minutes_to(curve: list[dict], metric: str, threshold: float) -> float | None:
    """Training minutes at the first validation at or above `threshold`; None if none reached it."""
    for point in curve:
        if point.get(metric) is not None and point[metric] >= threshold:
            return point["minutes"]
    return None


def summarise(method: str, row: dict, metric: str, teacher_accuracy: float, base_accuracy: float) -> dict:
    """A method's entry: the curve with the start (minute 0, the base accuracy) first, final accuracy, minutes to
    90% of the teacher's accuracy."""
    if "error" in row:
        return row
    start = {"step": 0, "minutes": 0.0, metric: base_accuracy}
    curve = [start] + row["curve"]
    return {**row, "curve": curve, "final_accuracy": row["curve"][-1][metric] if row["curve"] else None,
            "minutes_to_90pct_teacher": minutes_to(curve, metric, 0.9 * teacher_accuracy)}


def verdict(methods: dict[str, dict], teacher_accuracy: float, base_accuracy: float) -> dict:
    """Whether OPD reached 90% of the teacher in at most a third of GRPO's time (or GRPO never did while OPD did);
    None when the comparison means nothing: the student starts at or above 90% of its teacher."""
    opd = methods.get("opd", {}).get("minutes_to_90pct_teacher")
    grpo = methods.get("grpo", {}).get("minutes_to_90pct_teacher")
    if base_accuracy >= 0.9 * teacher_accuracy:
        met = None  # both "reach" it at minute 0
    elif opd is None:
        met = False
    elif grpo is None:
        met = "grpo" in methods and "error" not in methods["grpo"]
    else:
        met = opd <= TARGET_RATIO * grpo
    return {"opd_minutes": opd, "grpo_minutes": grpo, "ratio": round(opd / grpo, 3) if opd and grpo else None,
            "target": "OPD reaches 90% of the teacher's held-out accuracy in <= 1/3 of GRPO's training time, or "
                      "GRPO never reaches it within its budget while OPD does", "met": met,
            **({"note": "the student starts at or above 90% of the teacher's accuracy: nothing to compare"}
               if met is None else {})}


# ------------------------------------------------------------------ processes
def child(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)
    s = json.loads(args.settings)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.child == "teacher":
        row = build_teacher(s, _student_path(s, workdir), Path(args.teacher), workdir)
    elif args.child == "evaluate":
        student = _student_path(s, workdir)
        row = {"teacher": evaluate(args.teacher, s, student), "student": evaluate(student, s, student)}
    else:
        row = run_method(args.child, s, args.teacher, workdir)
    print("RESULT " + json.dumps(row), flush=True)
    return 0


def spawn(kind: str, s: dict, teacher: str, workdir: Path) -> dict:
    """Run `kind` (a method, "teacher" or "evaluate") in a fresh process, its log beside the results."""
    log = workdir / f"{kind}.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    print(f"{kind}: running (log {log})", flush=True)
    started = time.perf_counter()
    with open(log, "w") as f:
        done = subprocess.run([sys.executable, __file__, "--child", kind, "--settings", json.dumps(s),
                               "--teacher", teacher, "--workdir", str(workdir / kind)],
                              stdout=f, stderr=subprocess.STDOUT, env=env)
    results = [line[len("RESULT "):] for line in log.read_text().splitlines() if line.startswith("RESULT ")]
    if done.returncode or not results:
        return {"error": log.read_text().strip().splitlines()[-8:], "log": str(log)}
    print(f"{kind}: done in {(time.perf_counter() - started) / 60:.1f} min", flush=True)
    return json.loads(results[-1])


def teacher_folder(args: argparse.Namespace, s: dict, workdir: Path) -> tuple[str, dict]:
    """The teacher's folder and record: --teacher as given, or the cached one built by the recipe (built now if
    missing)."""
    if args.teacher:
        return args.teacher, {"made_by": "given (--teacher)"}
    name = f"{'tiny' if s['student'] == 'tiny' else 'smollm2'}-arithmetic-grpo{s['teacher_steps']}"
    folder = Path(args.teacher_cache).expanduser() / name
    if not (folder / "teacher.json").is_file():
        record = spawn("teacher", s, str(folder), workdir)
        if "error" in record:
            raise SystemExit(f"the teacher could not be built: {record}")
    return str(folder), json.loads((folder / "teacher.json").read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--teacher", default=None, help="the teacher's model folder (default: build one and cache it)")
    p.add_argument("--teacher-cache", default=str(DEFAULT_CACHE), help="where a built teacher is kept")
    p.add_argument("--teacher-steps", type=int, default=10, help="GRPO steps that make the teacher (the recipe's)")
    p.add_argument("--student", default=None, help="the student (default SmolLM2-135M-Instruct; --quick: tiny)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated, of: opd, grpo, sft")
    p.add_argument("--metric", choices=sorted(METRICS), default="lenient", help="held-out accuracy to compare")
    p.add_argument("--opd-steps", type=int, default=16)
    p.add_argument("--opd-lr", type=float, default=2e-5)
    p.add_argument("--opd-samples", type=int, default=None,
                   help="answers per prompt for OPD (default: the recipe's samples_per_prompt)")
    p.add_argument("--top-k", type=int, default=None,
                   help="OPD: the forward KL over the teacher's top-k tokens beside the reverse KL (0: off; "
                        "default: the recipe's top_k)")
    p.add_argument("--distill-coef", type=float, default=1.0, help="weight of the per-token reverse-KL advantage")
    p.add_argument("--grpo-steps", type=int, default=32)
    p.add_argument("--grpo-lr", type=float, default=2e-5)
    p.add_argument("--sft-steps", type=int, default=48)
    p.add_argument("--sft-batch", type=int, default=16)
    p.add_argument("--sft-lr", type=float, default=2e-5)
    p.add_argument("--sft-prompts", type=int, default=512, help="training prompts the teacher answers for sft")
    p.add_argument("--sft-temperature", type=float, default=0.0, help="the teacher's sampling for sft (0: greedy)")
    p.add_argument("--eval-every", type=int, default=4, help="steps between held-out validations (and at the end)")
    p.add_argument("--parallel", type=int, default=1, help="methods at a time (timings compare only at 1)")
    p.add_argument("--seed", type=int, default=0, help="the students' prompt order and sampling (repetitions)")
    p.add_argument("--quick", action="store_true", help="the harness on the tiny model, 2 steps each (minutes)")
    p.add_argument("--out", default=None, help="folder for the JSON (default: a temporary folder)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--settings", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    s = settings(args)
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        p.error(f"--methods: unknown {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    workdir = Path(tempfile.mkdtemp(prefix=f"distillation-{stamp}-"))
    if args.quick and not args.teacher:
        args.teacher_cache = str(workdir / "teachers")
    load_before = os.getloadavg()
    started = time.perf_counter()
    teacher, record = teacher_folder(args, s, workdir)
    accuracy = spawn("evaluate", s, teacher, workdir)
    if "error" in accuracy:
        raise SystemExit(f"the held-out evaluation failed: {accuracy}")
    teacher_acc, base_acc = accuracy["teacher"][s["metric"]], accuracy["student"][s["metric"]]
    print(f"teacher {teacher_acc:.1%}, student {base_acc:.1%} ({s['metric']}); 90% of the teacher: "
          f"{0.9 * teacher_acc:.1%}", flush=True)
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        rows = dict(zip(methods, pool.map(lambda m: spawn(m, s, teacher, workdir), methods)))
    summary = {m: summarise(m, row, s["metric"], teacher_acc, base_acc) for m, row in rows.items()}
    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "teacher_accuracy": teacher_acc, "student_base_accuracy": base_acc, "metric": s["metric"],
        "accuracy_both": accuracy, "teacher": {"path": teacher, **record}, "settings": s,
        "verdict": verdict(summary, teacher_acc, base_acc), "methods": summary,
        "wall_minutes": round((time.perf_counter() - started) / 60, 1),
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, one thread per method, {args.parallel} at a time",
        "command": " ".join(sys.argv), "logs": str(workdir),
    }
    out = Path(args.out) if args.out else workdir
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"distillation-{'quick-' if args.quick else ''}{stamp}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    report_pruned(workdir)
    for m, row in summary.items():
        if "error" in row:
            print(f"{m}: failed, see {row.get('log')}")
        else:
            print(f"{m}: final {row['final_accuracy']}, 90% of the teacher at {row['minutes_to_90pct_teacher']} min "
                  f"(training {row['train_minutes']:.1f} min)")
    print(json.dumps(result["verdict"]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
