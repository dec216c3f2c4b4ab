"""Datasets that come split (`--val-annotations`, `--val-images`): COCO's train and val files,
a Roboflow export's train/ and valid/ folders, TF OD API-style train and test CSVs. The val
split is the val annotations' images, whatever the hash would say; an image in both splits
is a duplicate, not a leak."""

import csv
import json
import shutil
from pathlib import Path

import pytest
import tensorflow as tf

from beam.contract import feature_keys as K
from beam.contract.codec import decode_example
from beam.contract.files import read_rejects
from beam.convert_job import DataBuildError, build_dataset
from beam.options import ConvertOptions
from pipeline.cli import main


def _ids_by_split(out: Path) -> dict[str, set[str]]:
    ids: dict[str, set[str]] = {"train": set(), "val": set()}
    for shard in out.glob("*.tfrecord"):
        for raw in tf.data.TFRecordDataset(str(shard)):
            ids[shard.name.split("-")[0]].add(decode_example(raw.numpy())[K.SOURCE_ID][0].decode())
    return ids


def test_raccoon_train_and_test_csvs_are_the_splits(raccoon, tmp_path, capsys):
    """Raccoon's own train_labels.csv and test_labels.csv (160 and 40 photos), through the CLI."""
    labels = raccoon / "labels"
    code = main(["data", "build", "--format", "csv", "--images", str(raccoon / "images"),
                 "--annotations", str(labels / "train_labels.csv"), "--val-annotations",
                 str(labels / "test_labels.csv"), "--output", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "200 records in: 160 train + 40 val written, 0 rejected" in out
    assert f"split: as the dataset comes: train from {labels / 'train_labels.csv'}" in out

    def stems(name: str) -> set[str]:
        return {Path(row["filename"]).stem for row in csv.DictReader((labels / name).open())}

    assert _ids_by_split(tmp_path / "out") == {"train": stems("train_labels.csv"), "val": stems("test_labels.csv")}
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["options"]["val_annotations"] == str(labels / "test_labels.csv")


def _roboflow_export(demo_dir: Path, root: Path) -> tuple[Path, Path]:
    """The demo as a Roboflow COCO export: train/ and valid/, each its images and its own
    `_annotations.coco.json` with ids from 0 (the same ids in both files), and one photo
    that was copied into both splits."""
    doc = json.loads((demo_dir / "coco.json").read_text())
    by_image = {}
    for ann in doc["annotations"]:
        by_image.setdefault(ann["image_id"], []).append(ann)
    entries = sorted(doc["images"], key=lambda e: e["file_name"])
    splits = {"train": entries[:48], "valid": entries[48:] + [entries[0]]}
    for split, chosen in splits.items():
        folder = root / split
        folder.mkdir(parents=True)
        images, anns = [], []
        for new_id, entry in enumerate(chosen):
            shutil.copyfile(demo_dir / "images" / entry["file_name"], folder / entry["file_name"])
            images.append({**entry, "id": new_id})
            anns += [{**a, "id": len(anns) + k, "image_id": new_id}
                     for k, a in enumerate(by_image.get(entry["id"], []))]
        (folder / "_annotations.coco.json").write_text(json.dumps(
            {"images": images, "annotations": anns, "categories": doc["categories"]}))
    return root / "train", root / "valid"


def test_a_roboflow_export_with_its_own_valid_folder(demo_dir, tmp_path):
    train, valid = _roboflow_export(demo_dir, tmp_path / "export")
    result = build_dataset(ConvertOptions(
        images=str(train), annotations=str(train / "_annotations.coco.json"), output=str(tmp_path / "out"),
        data_format="coco", val_annotations=str(valid / "_annotations.coco.json"), val_images=str(valid)))
    assert result.ok, result.anomalies
    m = result.manifest
    assert (m.records_in, m.written["train"], m.written["val"], m.rejected) == (65, 48, 16, 1)
    ((leak,),) = [[r for r in read_rejects(str(tmp_path / "out"))]]
    assert leak.reason == "duplicate_image_id" and leak.source_ref.startswith(str(valid))
    ids = _ids_by_split(tmp_path / "out")
    assert ids["val"] == {Path(p).stem for p in valid.glob("*.jpg")} - {leak.image_id}
    assert ids["train"] == {Path(p).stem for p in train.glob("*.jpg")}
    assert m.reconcile_problems() == []


def test_voc_folders_of_each_split_and_the_usage_errors(demo_dir, tmp_path, capsys):
    annotations = sorted((demo_dir / "annotations").glob("*.xml"))
    train, val = tmp_path / "train_xml", tmp_path / "val_xml"
    train.mkdir(), val.mkdir()
    for n, xml in enumerate(annotations):
        shutil.copyfile(xml, (val if n % 4 == 0 else train) / xml.name)
    result = build_dataset(ConvertOptions(images=str(demo_dir / "images"), annotations=str(train),
                                          output=str(tmp_path / "out"), val_annotations=str(val)))
    assert _ids_by_split(tmp_path / "out") == {"train": {p.stem for p in train.glob("*.xml")},
                                               "val": {p.stem for p in val.glob("*.xml")}}
    assert result.manifest.written["val"] == 16

    with pytest.raises(DataBuildError, match="give one"):
        build_dataset(ConvertOptions(images=str(demo_dir / "images"), annotations=str(train),
                                     output=str(tmp_path / "x"), val_annotations=str(val),
                                     split_file=str(tmp_path / "split.json")))
    base = ["data", "build", "--format", "voc", "--images", str(demo_dir / "images"), "--annotations", str(train),
            "--output", str(tmp_path / "y")]
    assert main([*base, "--val-images", str(demo_dir / "images")]) == 2
    assert "--val-images needs --val-annotations" in capsys.readouterr().err
    assert main([*base, "--val-annotations", str(demo_dir / "coco.json")]) == 2
    assert "--val-annotations " + str(demo_dir / "coco.json") + " is a file; --format voc reads a folder" \
        in capsys.readouterr().err
