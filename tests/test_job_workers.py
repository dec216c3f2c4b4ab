"""The data job as Dataflow runs it: in separate worker processes, every function pickled.
Two workers write what one writes (shards, rejects, manifest), on dirty data with rejects of
every kind; the job hands its results back through its own outputs; and a job that fails
leaves nothing a reader could take for a dataset."""

import json
from pathlib import Path

import pytest
from dirty_data import make_dirty_copy

from beam.contract.files import read_rejects
from beam.contract.manifest import MANIFEST_FILE, REJECTS_GLOB
from beam.convert_job import build_dataset, job_options
from beam.data_workers import default_workers
from beam.options import ConvertOptions


def _build(dirty, out: Path, workers: int):
    return build_dataset(ConvertOptions(
        images=str(dirty.images), annotations=str(dirty.annotations), output=str(out),
        split_file=str(dirty.split_file), label_map=dirty.label_map, keep_empty=False, max_pixels=dirty.max_pixels,
        allow_anomalies=True, num_workers=workers, min_shards=3))


@pytest.fixture(scope="module")
def dirty(demo_dir, tmp_path_factory):
    return make_dirty_copy(demo_dir / "images", demo_dir / "annotations", tmp_path_factory.mktemp("dirty_w"),
                           split_file=True, label_map=True, reject_empty=True, max_pixels=True)


def _manifest(out: Path) -> dict:
    data = json.loads((out / MANIFEST_FILE).read_text())
    data.pop("seconds")
    data["options"].pop("output")
    return data


def test_two_worker_processes_write_what_one_writes(dirty, tmp_path, monkeypatch):
    """Also the records moved in lists of 5, not the default 256: more lists than workers,
    the duplicate id's two records in different lists."""
    one, two = tmp_path / "one", tmp_path / "two"
    _build(dirty, one, workers=1)
    monkeypatch.setattr("beam.job_transforms.RECORDS_PER_ELEMENT", 5)
    result = _build(dirty, two, workers=2)
    assert result.manifest.records_in > 10 * 5
    names = sorted(p.name for p in one.iterdir() if p.suffix in (".tfrecord", ".jsonl"))
    assert names == sorted(p.name for p in two.iterdir() if p.suffix in (".tfrecord", ".jsonl"))
    assert sum(n.endswith(".tfrecord") for n in names) == 6 and "rejects-00000-of-00001.jsonl" in names
    for name in names:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    assert _manifest(one) == _manifest(two)
    rejects = read_rejects(str(two))
    assert {r.reason for r in rejects} == dirty.reasons  # every kind, through the sharded sink
    m = result.manifest
    assert m.records_in == m.written_total + m.rejected and m.rejected == len([r for r in rejects if not r.is_box])
    assert not (two / "_job").exists()


def _worker_command(runner) -> str | None:
    """The command the runner starts its worker processes with (None: in-process or Beam's own)."""
    return getattr(runner._default_environment, "command_string", None)  # what the FnApiRunner hands the pipeline


def test_the_local_runner_takes_workers_from_the_options():
    runner, options = job_options(ConvertOptions("i", "a", "o", num_workers=2), records=10)
    assert options.get_all_options()["direct_num_workers"] == 2
    assert "-m beam.local_worker --skip-imports pandas," in _worker_command(runner)
    assert _worker_command(runner).endswith(",google.cloud.storage")  # no gs:// path: no GCS client either
    runner, _ = job_options(ConvertOptions("gs://b/i", "a", "o", num_workers=2), records=10)
    assert "google.cloud.storage" not in _worker_command(runner)
    runner, options = job_options(ConvertOptions("i", "a", "o", num_workers=1), records=10)
    assert options.get_all_options()["direct_num_workers"] == 1 and _worker_command(runner) is None
    _, options = job_options(ConvertOptions("i", "a", "o", beam_args=("--direct_num_workers=3",)), records=10)
    assert options.get_all_options()["direct_num_workers"] == 3
    # Beam's own flag, either spelling, wins and runs worker processes (not threads in one)
    runner, options = job_options(ConvertOptions("i", "a", "o", beam_args=("--direct_num_workers", "2")), records=10)
    assert options.get_all_options()["direct_num_workers"] == 2 and "beam.local_worker" in _worker_command(runner)
    # A running mode of the user's: Beam's own workers
    runner, options = job_options(ConvertOptions("i", "a", "o", num_workers=2,
                                                 beam_args=("--direct_running_mode=multi_threading",)), records=10)
    assert options.get_all_options()["direct_running_mode"] == "multi_threading"
    assert _worker_command(runner) is None
    assert default_workers(500, 2) == 1 and default_workers(50_000, 2) == 2 and default_workers(7_000, 2) == 1 and default_workers(8_000, 2) == 2 and default_workers(50_000, 1) == 1


def test_two_worker_processes_run_the_job_with_the_malloc_settings_a_users_own_winning(monkeypatch):
    """A real two-worker run of the job's runner: its elements are processed outside this
    process, in workers whose environment has WORKER_MALLOC_ENV (the user's own value wins),
    which this process's environment does not get, and which do without the skipped
    modules; the job's result comes back whole. One worker was started before the job
    (`prestarted`) and runs it; the other command finds none left and runs the harness
    itself; at the end nothing is left running."""
    import os

    from beam.data_workers import JOB_MODULES, WORKER_MALLOC_ENV, worker_skips
    from beam.local_worker import _pools, prestarted

    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")  # the user's own value wins
    with prestarted(1, WORKER_MALLOC_ENV, worker_skips(("i", "a", "o")), JOB_MODULES) as early:
        runner, options = job_options(ConvertOptions("i", "a", "o", num_workers=2), records=10)
        assert "--attach" in _worker_command(runner)
        _run_on_workers(runner, options, early)
        folder = next(iter(_pools.values()))
    assert not _pools and not os.path.exists(folder)
    with pytest.raises(ProcessLookupError):
        os.kill(early[0], 0)
    assert "MALLOC_ARENA_MAX" not in os.environ


def _run_on_workers(runner, options, early: list[int]) -> None:
    import os

    import apache_beam as beam
    from apache_beam.testing.util import assert_that

    from beam.data_workers import WORKER_MALLOC_ENV

    driver = os.getpid()

    def worker_facts(_):  # defined here: pickled by value (a worker cannot import the tests)
        import importlib
        import os
        import sys

        try:
            importlib.import_module("pandas")
            pandas = "imported"
        except ImportError:
            pandas = "skipped"
        return (os.getpid(), os.environ.get("MALLOC_ARENA_MAX"), os.environ.get("MALLOC_MMAP_THRESHOLD_"), pandas,
                "google.cloud.bigquery" in sys.modules and sys.modules["google.cloud.bigquery"] is not None)

    def check(facts):
        assert len(facts) == 8 and driver not in {pid for pid, *_ in facts}, facts
        assert {tuple(f[1:]) for f in facts} == {(WORKER_MALLOC_ENV["MALLOC_ARENA_MAX"], "65536", "skipped", False)}
        assert set(early) <= {pid for pid, *_ in facts}, (early, facts)

    with beam.Pipeline(runner=runner, options=options) as p:
        assert_that(p | beam.Create(range(8), reshuffle=True) | beam.Map(worker_facts), check)


def test_workers_started_early_that_no_job_claims_are_stopped_and_a_failed_one_is_not_waited_for(tmp_path):
    """A worker whose import fails takes itself off the folder (a command then runs the
    harness itself rather than wait for it); one that no job claimed is stopped at the
    end of the block."""
    import os

    from beam.local_worker import _attach, _pools, prestarted

    with prestarted(1, preload=("a_module_nobody_has",)) as failed:
        assert _attach(next(iter(_pools.values()))) is None  # waited while it imported, then not
    with prestarted(2) as unclaimed:
        folder = next(iter(_pools.values()))
    assert not os.path.exists(folder)
    for pid in failed + unclaimed:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_workers_started_early_in_a_long_tmpdir_listen_in_a_short_folder(tmp_path, monkeypatch):
    """A Unix socket's path has at most ~107 bytes: under a TMPDIR too long for one, the
    workers' folder goes to /tmp, and they come up (before, each failed with "AF_UNIX path
    too long" and the job waited a minute for them). A worker whose socket fails all the
    same takes itself off the folder, so no command waits for it."""
    import os
    import subprocess
    import sys
    import tempfile
    import time

    from conftest import REPO

    from beam.local_worker import MODULE, READY, SOCKET_PATH_MAX, STARTING, WAIT_FLAG, _pools, prestarted

    long = tmp_path / ("x" * 60) / ("y" * 60)
    long.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(long))
    monkeypatch.setattr(tempfile, "tempdir", None)
    with prestarted(2):
        folder = next(iter(_pools.values()))
        assert len(os.path.join(folder, "0.sock")) <= SOCKET_PATH_MAX and not folder.startswith(str(long))
        deadline = time.monotonic() + 120
        while sorted(os.listdir(folder)) != [f"0{READY}", "0.sock", f"1{READY}", "1.sock"]:
            assert time.monotonic() < deadline, os.listdir(folder)
            time.sleep(0.1)
    assert not os.path.exists(folder)

    (long / f"0{STARTING}").touch()
    run = subprocess.run([sys.executable, "-m", MODULE, WAIT_FLAG, str(long / "0")], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "AF_UNIX path too long" in run.stderr
    assert not list(long.iterdir())


def test_a_failed_job_leaves_nothing_a_reader_takes_for_a_dataset(demo_dir, tmp_path, monkeypatch):
    def fail(record, image_bytes):
        raise RuntimeError("disk gone")

    monkeypatch.setattr("beam.example_codec.written_image", fail)
    out = tmp_path / "out"
    with pytest.raises(Exception, match="disk gone"):
        build_dataset(ConvertOptions(images=str(demo_dir / "images"), annotations=str(demo_dir / "annotations"),
                                     output=str(out), num_workers=1))
    assert sorted(p.name for p in out.iterdir()) == []
    assert not list(out.glob("*.tfrecord")) and not list(out.glob(REJECTS_GLOB))


def test_the_job_workers_import_tensorflow_for_the_image_check_and_not_tfdv(tmp_path):
    """A worker process unpickles the job's stages and imports what they import: TensorFlow,
    whose decoders check every image (beam/contract/decoding.py: Pillow reads some damaged
    JPEGs that TensorFlow refuses), but not TFDV (the driver's statistics), whose import would
    add to each worker's start. The stages' own lazy imports are imported too, as a worker
    started early imports them (JOB_MODULES)."""
    import subprocess
    import sys

    from apache_beam.internal import pickler
    from conftest import REPO

    from beam import job_transforms as jt
    from beam.data_workers import JOB_MODULES
    from beam.record_checks import CheckOptions

    stages = [jt._CheckChunk("images", CheckOptions(), 10), jt._WriteShard("out", False), jt._parse_chunk,
              jt._by_shard, jt._by_rejects_file, jt._write_rejects, jt.chunk_summary, jt.dropped_boxes,
              jt.CombineSummaries()]
    (tmp_path / "stages.pickle").write_bytes(pickler.dumps(stages))
    code = ("import sys\nfrom apache_beam.internal import pickler\n"
            f"pickler.loads(open({str(tmp_path / 'stages.pickle')!r}, 'rb').read())\n"
            f"for name in {JOB_MODULES!r}: __import__(name)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'tensorflow_data_validation'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['tensorflow']", out.stdout[:500]


def test_a_worker_that_dies_mid_job_fails_it_at_once_instead_of_hanging(tmp_path):
    """A worker process killed in the middle of a local job (here its own `os._exit`, as the
    out-of-memory killer would) makes the job raise `WorkerDied`, for a worker started with
    the job and for one started early. Beam's runner alone waits for that worker's bundle for
    ever: run in a process of its own with a time limit, so a regression fails here."""
    import subprocess
    import sys

    from conftest import REPO

    code = """
import sys
import apache_beam as beam
from beam.runner import runner_and_options
from beam.local_worker import WorkerDied, failing_when_a_worker_dies, prestarted

def die_on_5(x):
    import os
    if x == 5:
        os._exit(3)
    return x

for early in (0, 2):
    with prestarted(early):
        runner, options = runner_and_options("DirectRunner", (), 2)
        try:
            with failing_when_a_worker_dies(), beam.Pipeline(runner=runner, options=options) as p:
                _ = p | beam.Create(range(20), reshuffle=True) | beam.Map(die_on_5)
        except WorkerDied as err:
            print("WorkerDied:", err)
"""
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("WorkerDied:")]
    assert len(lines) == 2 and "return code 3" in lines[0] and "killed by the system for memory?" in lines[1], run.stdout


@pytest.mark.parametrize("workers", [1, 2])
def test_a_ctrl_c_stops_the_command_and_its_workers_with_one_line(demo_dir, tmp_path, workers):
    """`detpipe data build` with two workers and with one (in the command's process, where
    Beam wraps the KeyboardInterrupt in an error of its own), interrupted as a terminal's
    Ctrl-C does (a SIGINT to its whole process group) while a worker is stuck reading an
    image (a named pipe nobody writes to, as a stalled network mount): exit status 130, one
    line and no traceback, no process of the group left, no `_job` folder, no worker folder.
    Before, every process printed its own traceback (~340 lines with two workers) and the
    stuck worker was waited for; with one, the command ended with an error line, status 1."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil
    from conftest import REPO

    from pipeline.interrupt import EXIT_INTERRUPTED

    images = tmp_path / "images"
    images.mkdir()
    stuck = sorted((demo_dir / "images").iterdir())[3].name
    for image in (demo_dir / "images").iterdir():
        if image.name != stuck:
            (images / image.name).symlink_to(image)
    os.mkfifo(images / stuck)
    temp, out, log = tmp_path / "temp", tmp_path / "out", tmp_path / "stderr.txt"
    temp.mkdir()
    # SIGINT as a terminal leaves it (this test may run where it is ignored, as in `make test &`).
    code = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
            "sys.argv = ['detpipe', *sys.argv[1:]]; runpy.run_module('pipeline.cli', run_name='__main__')")
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", code, "data", "build", "--format", "voc", "--images", str(images),
             "--annotations", str(demo_dir / "annotations"), "--output", str(out), "--direct-num-workers",
             str(workers)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
            env={**os.environ, "TMPDIR": str(temp)})
    group = process.pid
    try:
        deadline = time.monotonic() + 120
        while "validate-and-convert:" not in log.read_text() and time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(2)  # the job under way: a worker waits on the pipe
        assert process.poll() is None, log.read_text()[-3000:]
        assert len(psutil.Process(group).children(recursive=True)) >= (2 if workers > 1 else 0)
        os.killpg(group, signal.SIGINT)
        assert process.wait(timeout=60) == EXIT_INTERRUPTED
    finally:
        with __import__("contextlib").suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    text = log.read_text()
    after = text[text.index("detpipe: interrupted"):].strip().splitlines()
    assert after == ["detpipe: interrupted: stopping (Ctrl-C again to quit at once)"], text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    left = [p for p in psutil.process_iter(["status"]) if _group_of(p) == group and p.info["status"] != "zombie"]
    assert left == []
    assert not (out / "_job").exists() and not list(temp.iterdir())


def _group_of(process) -> int | None:
    import os

    try:
        return os.getpgid(process.pid)
    except (ProcessLookupError, PermissionError):
        return None
