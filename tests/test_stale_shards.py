"""No stale data: a build refuses a folder holding an earlier one, --overwrite replaces it,
and readers trust only the shards the manifest lists."""

import json

import pytest

from components.detector.records import ShardsChanged, count_records, eval_examples, shard_files
from pipeline.cli import main
from pipeline.demo_data import write_demo_dataset


@pytest.mark.slow
def test_a_second_build_into_the_same_folder(tmp_path, capsys):
    big, small, out = tmp_path / "big", tmp_path / "small", tmp_path / "out"
    write_demo_dataset(big, num_train=12, num_val=3, seed=1)
    write_demo_dataset(small, num_train=4, num_val=2, seed=2)
    build = ["data", "build", "--format", "voc", "--output", str(out), "--val-fraction", "0.5", "--allow-anomalies"]
    assert main([*build, "--images", str(big / "images"), "--annotations", str(big / "annotations")]) == 0
    capsys.readouterr()

    code = main([*build, "--images", str(small / "images"), "--annotations", str(small / "annotations")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "not empty" in err[0] and "--overwrite" in err[0]

    (out / "notes.txt").write_text("the user's own notes")  # not written by a build: kept
    old_shards = {p.name for p in out.glob("*.tfrecord")}
    assert main([*build, "--overwrite", "--images", str(small / "images"),
                  "--annotations", str(small / "annotations")]) == 0
    assert (out / "notes.txt").read_text() == "the user's own notes"
    manifest = json.loads((out / "manifest.json").read_text())
    assert {p.name for p in out.glob("*.tfrecord")} == {s["name"] for s in manifest["shards"]} != old_shards
    for split in ("train", "val"):
        assert count_records(str(out), split) == manifest["written"][split]
        assert sum(1 for _ in eval_examples(str(out), split)) == manifest["written"][split]
    assert manifest["written_total"] == 6
    assert not (out / "_job").exists() and not list(out.glob("_*.json"))  # nothing left behind


def test_readers_take_the_manifest_list_and_check_it(demo_shards, tmp_path):
    import shutil

    copy = tmp_path / "shards"
    shutil.copytree(demo_shards, copy)
    listed = shard_files(str(copy), "train")
    (copy / "train-00099-of-00100.tfrecord").write_bytes(b"an old shard")  # not in the manifest: ignored
    assert shard_files(str(copy), "train") == listed
    with open(listed[0], "ab") as handle:
        handle.write(b"x")
    with pytest.raises(ShardsChanged, match="bytes, manifest.json says"):
        shard_files(str(copy), "train")
    (copy / listed[0].rsplit("/", 1)[-1]).unlink()
    with pytest.raises(ShardsChanged, match="missing"):
        shard_files(str(copy), "train")


def test_overwrite_removes_only_what_a_build_writes_and_refuses_other_folders(tmp_path, capsys):
    from beam.contract.manifest import written_by_build
    from beam.convert_job import build_dataset
    from beam.options import ConvertOptions

    data = tmp_path / "d"
    write_demo_dataset(data, num_train=4, num_val=2, seed=4)
    source = ["--images", str(data / "images"), "--annotations", str(data / "annotations")]
    # A folder of the user's own files is not an earlier build: refused, even with --overwrite.
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "holiday.jpg").write_bytes(b"precious")
    build = ["data", "build", "--format", "voc", "--val-fraction", "0.5", "--allow-anomalies", *source]
    assert main([*build, "--output", str(photos), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an earlier build" in err[0] and "holiday.jpg" in err[0]
    assert "--overwrite-unrecognised" in err[0]
    # The same check in the job itself (the KFP step and library callers do not pass the CLI).
    with pytest.raises(ValueError, match="not an earlier build"):
        build_dataset(ConvertOptions(images=str(data / "images"), annotations=str(data / "annotations"),
                                     output=str(photos), overwrite=True))
    # Told: the build goes in beside the user's file, which stays.
    assert main([*build, "--output", str(photos), "--overwrite", "--overwrite-unrecognised"]) == 0
    assert (photos / "holiday.jpg").read_bytes() == b"precious"
    # Every file a real build wrote is one `--overwrite` knows it may remove.
    assert all(written_by_build(p.name) for p in photos.iterdir() if p.name != "holiday.jpg")


def test_an_output_folder_that_cannot_be_made_is_said_in_one_line():
    """Where the folder cannot be made (here under /proc), the build stops before its job with
    the folder named, not TensorFlow's bare `NotFoundError: PATH; ...`."""
    from beam.convert_job import DataBuildError, prepare_output

    with pytest.raises(DataBuildError, match=r"^--output /proc/detpipe-test/out cannot be created \(.+\)$"):
        prepare_output("/proc/detpipe-test/out", overwrite=False)


def test_a_folder_holding_only_an_unfinished_builds_job_folder_is_built_into(demo_dir, tmp_path, caplog):
    """A build killed mid-job (SIGKILL, out of memory) leaves OUTPUT/_job/ and nothing a reader
    takes: the next build into that folder removes it, says so, and builds (no --overwrite)."""
    out = tmp_path / "out"
    (out / "_job" / "shards").mkdir(parents=True)
    (out / "_job" / "shards" / "train-00000-of-00004.tfrecord").write_bytes(b"half a shard")
    assert main(["data", "build", "--format", "voc", "--images", str(demo_dir / "images"), "--annotations",
                 str(demo_dir / "annotations"), "--output", str(out)]) == 0
    assert "removing _job/, left by a build that did not finish" in caplog.text
    manifest = json.loads((out / "manifest.json").read_text())
    assert not (out / "_job").exists() and manifest["written_total"] == manifest["records_in"]
