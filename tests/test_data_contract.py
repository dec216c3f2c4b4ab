"""The data step's files as its readers get them: one real build of a dirty dataset (every
reject reason the checks know, box-level drops, awkward images that must pass), and each
reader (the manifest and rejects definitions, the dataset page, the run report, the CLI
lines) run on exactly what that build wrote. No reader here sees a hand-made row."""

import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import tensorflow as tf
from dirty_data import PREFIX, make_dirty_copy, split_of

from beam import record_checks as rc
from beam.contract import feature_keys as K
from beam.contract import rejects as rj
from beam.contract.codec import decode_example
from beam.contract.files import read_manifest, read_rejects
from beam.convert_job import build_dataset
from beam.options import ConvertOptions
from components.report.run_report import write_dataset_page

EVERY_REASON = {value for name, value in vars(rj).items() if name.isupper() and isinstance(value, str)}


def _build(dirty, out: Path, **options):
    return build_dataset(ConvertOptions(
        images=str(dirty.images), annotations=str(dirty.annotations), output=str(out),
        split_file=str(dirty.split_file), label_map=dirty.label_map, keep_empty=False, max_pixels=dirty.max_pixels,
        allow_anomalies=True, **options))


@pytest.fixture(scope="module")
def dirty(demo_dir, tmp_path_factory):
    return make_dirty_copy(demo_dir / "images", demo_dir / "annotations", tmp_path_factory.mktemp("dirty"),
                           split_file=True, label_map=True, reject_empty=True, max_pixels=True, hostile=True)


@pytest.fixture(scope="module")
def built(dirty, tmp_path_factory):
    out = tmp_path_factory.mktemp("dirty_shards")
    return out, _build(dirty, out)


def _shard_records(out: Path) -> dict[str, tuple[str, dict]]:
    records = {}
    for shard in sorted(out.glob("*.tfrecord")):
        for raw in tf.data.TFRecordDataset(str(shard)):
            example = decode_example(raw.numpy())
            records[example[K.SOURCE_ID][0].decode()] = (shard.name.split("-")[0], example)
    return records


def test_the_shards_are_what_tensorflow_would_write(dirty, built, tmp_path, monkeypatch):
    """The job's workers write Examples and TFRecord framing without TensorFlow
    (beam/contract/example_proto.py, beam/contract/shards.py): the same build with TensorFlow's own
    Example classes writes the same shards, and each shard is the file TensorFlow's writer
    makes of its records."""
    out, _ = built
    monkeypatch.setattr("beam.contract.codec.pb", tf.train)  # in-process: the one worker sees it
    _build(dirty, tmp_path / "tf", num_workers=1)
    shards = sorted(out.glob("*.tfrecord"))
    assert len(shards) >= 2 and [s.name for s in shards] == sorted(p.name for p in (tmp_path / "tf").glob("*.tfrecord"))
    for shard in shards:
        assert (tmp_path / "tf" / shard.name).read_bytes() == shard.read_bytes(), shard.name
        with tf.io.TFRecordWriter(str(tmp_path / shard.name)) as writer:
            for raw in tf.data.TFRecordDataset(str(shard)):
                writer.write(raw.numpy())
        assert (tmp_path / shard.name).read_bytes() == shard.read_bytes(), shard.name


def test_every_reason_the_checks_know_is_produced_by_a_real_input(dirty):
    # A new reason code without a dirty input that produces it fails here.
    assert dirty.reasons == EVERY_REASON


def test_rejects_are_what_the_dirty_inputs_should_give(dirty, built):
    out, _ = built
    rejects = read_rejects(str(out))
    images = {r.image_id + ("#duplicate" if r.reason == rj.DUPLICATE_IMAGE_ID else ""): r.reason
              for r in rejects if not r.is_box}
    boxes = {(r.image_id, r.box_index): r.reason for r in rejects if r.is_box}
    assert images == dirty.image_rejects and boxes == dirty.box_rejects
    assert all(r.message and "\n" not in r.message and r.source_ref for r in rejects)
    for r in rejects:
        if r.is_box:
            assert r.class_text and r.split in ("train", "val") and f"box {r.box_index} " in r.message


def test_a_dropped_box_keeps_its_image_and_its_other_boxes(dirty, built):
    out, _ = built
    records = _shard_records(out)
    ((image_id, kept),) = dirty.kept_boxes.items()
    split, example = records[image_id]
    template = ET.parse(dirty.annotations / f"{dirty.template_id}.xml").getroot()
    width, height = int(template.findtext("size/width")), int(template.findtext("size/height"))
    originals = [[float(o.findtext(f"bndbox/{k}")) for k in ("xmin", "ymin", "xmax", "ymax")]
                 for o in template.findall("object")]
    assert len(example[K.XMIN]) == kept == len(originals)
    for i, (xmin, ymin, xmax, ymax) in enumerate(originals):
        assert math.isclose(example[K.XMIN][i], xmin / width, abs_tol=1e-6)
        assert math.isclose(example[K.YMAX][i], ymax / height, abs_tol=1e-6)
    assert split == split_of(dirty)[image_id]  # and the split file decided where it went
    for image_id, odd in dirty.accepted.items():
        assert image_id in records, odd


def test_manifest_reconciles_images_and_boxes_with_the_rejects_file(dirty, built):
    out, result = built
    manifest = read_manifest(str(out))  # the file, through its one definition
    assert manifest == result.manifest and manifest.reconcile_problems() == []
    rejects = read_rejects(str(out))
    assert manifest.rejected == sum(1 for r in rejects if not r.is_box)
    assert manifest.records_in == manifest.written_total + manifest.rejected
    records = _shard_records(out)
    for split, counts in manifest.boxes.items():
        in_shards = sum(len(ex[K.XMIN]) for s, ex in records.values() if s == split)
        assert counts.written == in_shards
        dropped = [r for r in rejects if r.is_box and r.split == split]
        assert counts.rejected == len(dropped) and counts.boxes_in == in_shards + len(dropped)
    assert manifest.boxes_rejected_by_reason == {"box_outside_image": 1, "invalid_box": 4}
    assert manifest.color_modes["RGBA"] == 1 and manifest.color_modes["L"] == 1
    assert manifest.exif_orientation["applied"] == 1
    assert manifest.converted_formats == {"GIF": 1}
    assert records[f"{PREFIX}gif"][1][K.FORMAT] == [b"png"]
    assert records[f"{PREFIX}gif"][1][K.ENCODED][0].startswith(b"\x89PNG")
    # The split file decided every written image's split.
    listed = split_of(dirty)
    assert all(listed[image_id] == split for image_id, (split, _) in records.items())


def test_dataset_page_renders_every_reason_with_examples(dirty, built, tmp_path):
    from test_run_report import check_self_contained

    out, _ = built
    html = write_dataset_page(str(out), tmp_path / "page.html").read_text()
    check_self_contained(html)
    for reason in EVERY_REASON:
        assert f"<td>{reason}</td>" in html, reason
    rejects = read_rejects(str(out))
    for image_id in {r.image_id for r in rejects}:
        assert f"<code>{image_id}</code>" in html
    assert "Dropped boxes by reason" in html and "too many rejects" in html  # the real gate's anomaly
    assert re.search(r"<td>train</td><td class=\"num\">\d+</td>", html)  # the box counts per split


def test_data_build_cli_names_the_dropped_boxes(dirty, tmp_path):
    """`detpipe data build` as a user runs it, a process of its own with two workers: they
    start before its imports (`prestarted_data_workers`), it leaves at once when done (its
    output flushed first), and leaves no worker folder behind."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    label_map = tmp_path / "labels.json"
    label_map.write_text(json.dumps(dirty.label_map))
    temp = tmp_path / "temp"
    temp.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "data", "build", "--format", "voc", "--images", str(dirty.images),
         "--annotations", str(dirty.annotations), "--output", str(tmp_path / "out"), "--split-file",
         str(dirty.split_file), "--label-map", str(label_map), "--reject-empty", "--max-pixels",
         str(dirty.max_pixels), "--allow-anomalies", "--direct-num-workers", "2"],
        cwd=REPO, capture_output=True, text=True,  # buffered output, as in a pipe: flushed before it leaves?
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "TMPDIR": str(temp)})
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "box(es) dropped 4 of" in out and "invalid_box" in out and "box_outside_image" in out
    for reason in set(dirty.image_rejects.values()):
        assert f": {reason} (details in" in out
    assert read_manifest(str(tmp_path / "out")).records_in == len(list(dirty.annotations.glob("*.xml")))
    assert "on worker" in run.stderr and not list(temp.iterdir())


def test_bad_box_reject_image_keeps_the_old_behaviour(dirty, tmp_path):
    result = _build(dirty, tmp_path / "out", bad_box="reject-image")
    ((image_id, _),) = dirty.kept_boxes.items()
    rejects = {r.image_id: r for r in read_rejects(str(tmp_path / "out"))}
    assert rejects[image_id].reason == rj.INVALID_BOX and not rejects[image_id].is_box
    assert not any(r.is_box for r in rejects.values()) and result.manifest.boxes_rejected_by_reason == {}


def test_an_image_whose_every_box_is_dropped_follows_reject_empty():
    import io

    from PIL import Image

    from beam.source_records import SourceBox, SourceRecord

    buffer = io.BytesIO()
    Image.new("RGB", (20, 10)).save(buffer, format="PNG")
    record = SourceRecord("a", "a.png", 20, 10, (SourceBox("cat", 5, 5, 5, 8), SourceBox("cat", 1, 1, 40, 9)), "a.xml")
    rejected = rc.check_record(record, buffer.getvalue(), rc.CheckOptions(keep_empty=False))
    assert rejected.reason == rj.NO_BOXES and "all 2 box(es) dropped" in rejected.message
    kept = rc.check_record(record, buffer.getvalue(), rc.CheckOptions())
    assert kept.boxes == () and [r.reason for r in kept.dropped_boxes] == [rj.INVALID_BOX, rj.BOX_OUTSIDE_IMAGE]


def test_the_examples_in_the_definitions_run():
    """Every module of beam/ and of the shard contract (beam/contract/): its examples run."""
    import doctest
    import importlib
    import pkgutil

    import beam
    import beam.contract

    names = [f"beam.{m.name}" for m in pkgutil.iter_modules(beam.__path__)]
    names += [f"beam.contract.{m.name}" for m in pkgutil.iter_modules(beam.contract.__path__)]
    assert "beam.contract.manifest" in names and "beam.record_checks" in names
    for module in (importlib.import_module(name) for name in names if name != "beam.contract"):
        assert doctest.testmod(module).failed == 0, module.__name__
