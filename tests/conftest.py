"""Shared fixtures: a tiny demo dataset, its converted shards, the raccoon dataset and its shards."""

import os
import shutil
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from filelock import FileLock

# XLA on a CPU (the tests force the GPU path's `--xla on`) spends most of a run compiling:
# without LLVM's expensive passes a tiny detector's train step compiles in ~17 s, not ~38 s.
# Set before any test imports TensorFlow (and inherited by the processes tests start); a
# value the caller set wins. Only compile time changes: the tests compare losses, not speed.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")
# One thread in each of TensorFlow's op pools, in this process and those it starts. `make test` runs
# more TensorFlow processes than there are cores (TEST_WORKERS, and the DAG steps, trainers, servers
# and Beam workers they start), each sizing its pools to every core; their idle threads spin-wait
# for work, CPU the other processes needed. Measured on 2 cores, three slow test files on three
# workers: 189 s user + 22 s system CPU, 109 s wall with the default pools; 154 + 13 s, 88 s with
# these. Speed only: no test compares times, and tf.data keeps its own pool.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

import components  # noqa: E402,F401  its __init__ trims TensorFlow's import here as in the CLI (components/tf_import.py)

# Grappler, TensorFlow's graph optimizer, rewrites every new graph before its first run (fusing
# ops for faster steps): ~1.2-2 s of the ~8-10 CPU-seconds a tiny 6-step training takes here, where
# the steps it speeds up are a handful. Off in this process only, where most tests train, trace and
# export in small: the processes tests start (the DAG's steps, the CLI, workers, servers) run
# TensorFlow as shipped, Grappler on. The graphs compute the same functions either way.
import tensorflow as tf  # noqa: E402

tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})

REPO = Path(__file__).resolve().parents[1]
# The real photos, in the repository (tests/data/README.md), so a clone tests with nothing beside it.
RACCOON = Path(os.environ.get("DETPIPE_RACCOON", REPO / "tests" / "data" / "raccoon"))


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder `build` fills, built once for the whole run. `make test` runs the suite in
    several worker processes (pytest-xdist, the Makefile's TEST_WORKERS), each with its own session fixtures, so a shared dataset
    or model would otherwise be built once per process: the first to ask builds it here, under a
    lock, and the others wait and read it (what pytest-xdist's docs advise). Tests read these
    folders and never write into them."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # this run's folder, above each worker's own
    out, built = root / f"shared-{name}", root / f"shared-{name}.built"
    with FileLock(str(root / f"shared-{name}.lock")):
        if not built.exists():
            shutil.rmtree(out, ignore_errors=True)  # a build that failed half-way
            out.mkdir()
            build(out)
            built.touch()
    return out


@pytest.fixture(scope="session")
def raccoon() -> Path:
    assert (RACCOON / "annotations").is_dir(), (
        f"the raccoon dataset is expected at {RACCOON} (tests/data/raccoon); set DETPIPE_RACCOON")
    return RACCOON


@pytest.fixture(scope="session")
def raccoon_shards(raccoon, tmp_path_factory) -> Path:
    """Raccoon converted with the defaults: 157 train and 43 val real photos, 1 class."""
    from beam.convert_job import build_dataset
    from beam.options import ConvertOptions

    def build(out: Path) -> None:
        result = build_dataset(ConvertOptions(images=str(raccoon / "images"),
                                              annotations=str(raccoon / "annotations"), output=str(out)))
        assert result.ok, result.anomalies

    return built_once(tmp_path_factory, "raccoon_shards", build)


@pytest.fixture(scope="session")
def raccoon_model(raccoon_shards, tmp_path_factory):
    """A small detector trained a few steps on real photos (one class): a model to run, not to trust."""
    from components.train.trainer import TrainConfig, train_detector

    return built_once(tmp_path_factory, "raccoon_model", lambda out: train_detector(TrainConfig(
        data_dir=str(raccoon_shards), output_dir=str(out), epochs=1, batch_size=8, image_size=64, max_steps=3)))


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory) -> Path:
    from pipeline.demo_data import write_demo_dataset

    return built_once(tmp_path_factory, "demo", lambda out: write_demo_dataset(out, num_train=48, num_val=16, seed=3))


@pytest.fixture(scope="session")
def demo_shards(demo_dir, tmp_path_factory) -> Path:
    from beam.convert_job import build_dataset
    from beam.options import ConvertOptions

    def build(out: Path) -> None:
        result = build_dataset(ConvertOptions(images=str(demo_dir / "images"),
                                              annotations=str(demo_dir / "annotations"), output=str(out),
                                              val_fraction=0.25))
        assert result.ok, result.anomalies

    return built_once(tmp_path_factory, "demo_shards", build)


@pytest.fixture(scope="session")
def small_object_shards(tmp_path_factory) -> Path:
    """9-22 px objects in 280-400 px photos: boxes the fixed 128 px shape cannot learn."""
    from beam.convert_job import build_dataset
    from beam.options import ConvertOptions
    from pipeline.demo_data import write_demo_dataset

    raw, out = tmp_path_factory.mktemp("small_objects"), tmp_path_factory.mktemp("small_object_shards")
    write_demo_dataset(raw, num_train=24, num_val=8, seed=5, object_size=(9, 22), image_size=(280, 400))
    result = build_dataset(ConvertOptions(images=str(raw / "images"), annotations=str(raw / "annotations"),
                                          output=str(out), val_fraction=0.25))
    assert result.ok, result.anomalies
    return out


@pytest.fixture(scope="session")
def large_photo_shards(tmp_path_factory) -> Path:
    """10-16 px objects in 700-1000 px photos: what tiles at full resolution are for."""
    from beam.convert_job import build_dataset
    from beam.options import ConvertOptions
    from components.detector.tile_counts import count_tiles
    from pipeline.demo_data import write_demo_dataset

    def build(out: Path) -> None:
        raw = tmp_path_factory.mktemp("large_photos")
        write_demo_dataset(raw, num_train=10, num_val=4, seed=7, object_size=(10, 16), image_size=(700, 1000),
                           objects=(6, 12))
        result = build_dataset(ConvertOptions(images=str(raw / "images"), annotations=str(raw / "annotations"),
                                              output=str(out), val_fraction=0.25),
                               count_tiles=partial(count_tiles, mode="auto"))  # as `data build` counts them
        assert result.ok, result.anomalies

    return built_once(tmp_path_factory, "large_photo_shards", build)


@pytest.fixture(scope="session")
def trained_model(demo_shards, tmp_path_factory) -> Path:
    from components.train.trainer import TrainConfig, train_detector

    # Enough steps that some scores pass the decoder's 0.05 (the classifier starts at the
    # focal loss's prior of 0.01), so tests of detections compare something.
    return built_once(tmp_path_factory, "trained_model", lambda out: train_detector(TrainConfig(
        data_dir=str(demo_shards), output_dir=str(out), epochs=7, batch_size=8)))


# The longest modules, longest first, as measured in a clean `make test` (2 cores, 2 workers,
# 2026-12-07; seconds of each module's tests there: 112, 102, 99, 85, 73, 67, 64, 52, 50, 47, 45,
# 40): a run of the whole DAG, a killed worker, the faults, a search stopped and resumed, the GPU
# policies and layouts. They start first, whatever their count of slow tests.
LONGEST = ("test_multi_worker", "test_pipeline_local", "test_checkpoints", "test_pipeline_dirty", "test_tuning",
           "test_mixed_float16", "test_serving", "test_multi_device", "test_tiled_training", "test_mixed_bfloat16",
           "test_job_workers", "test_file_export")


def pytest_collection_modifyitems(session, config, items):
    """The longest modules first, then those with the most slow tests: `make test` gives each
    module to one of its workers (pytest-xdist, --dist loadfile) in this order (the Makefile's
    --no-loadscope-reorder: by default pytest-xdist orders modules by their count of tests), and a
    long module that starts last finishes alone: the multi-device module, started last, ran 52 s
    after the other worker had finished (11:52 in all)."""
    slow = Counter(item.module.__name__ for item in items if item.get_closest_marker("slow"))

    def order(item) -> tuple[int, int]:
        name = item.module.__name__.rsplit(".", 1)[-1]
        return (LONGEST.index(name) if name in LONGEST else len(LONGEST), -slow[item.module.__name__])

    items.sort(key=order)  # stable: the order within a module is kept
