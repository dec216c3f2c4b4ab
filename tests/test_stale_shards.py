"""No stale data: a build refuses a folder holding an earlier one, --overwrite replaces it,
and readers trust only the shards the manifest lists."""

import json

import pytest

from components.train.input_pipeline import ShardsChanged, count_records, eval_examples, shard_files
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

    assert main([*build, "--overwrite", "--images", str(small / "images"),
                  "--annotations", str(small / "annotations")]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
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
