"""VOC, COCO and CSV readers: the same dataset in any format gives the same shards."""

import json
from pathlib import Path

import pytest

from beam.coco_reader import parse_coco
from beam.contract.rejects import Reject
from beam.convert_job import build_dataset
from beam.csv_reader import parse_csv
from beam.options import ConvertOptions
from beam.source_records import SourceRecord
from beam.voc_reader import read_voc_file


def _build(images, annotations, fmt, out):
    return build_dataset(ConvertOptions(images=str(images), annotations=str(annotations), output=str(out),
                                        data_format=fmt, val_fraction=0.25))


def _shard_bytes(out):
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.tfrecord"))}


def test_voc_coco_csv_give_byte_identical_shards(demo_dir, tmp_path):
    voc = _build(demo_dir / "images", demo_dir / "annotations", "voc", tmp_path / "voc")
    coco = _build(demo_dir / "images", demo_dir / "coco.json", "coco", tmp_path / "coco")
    csv = _build(demo_dir / "images", demo_dir / "labels.csv", "csv", tmp_path / "csv")
    reference = _shard_bytes(tmp_path / "voc")
    assert reference and sum(len(v) for v in reference.values()) > 0
    assert _shard_bytes(tmp_path / "coco") == reference
    assert _shard_bytes(tmp_path / "csv") == reference
    assert voc.manifest.shards == coco.manifest.shards == csv.manifest.shards
    assert voc.manifest.records_in == coco.manifest.records_in == csv.manifest.records_in == 64
    assert voc.manifest.boxes == coco.manifest.boxes == csv.manifest.boxes
    # Boxes per split and class, reconciling with the box counts.
    classes = voc.manifest.class_boxes
    assert classes == coco.manifest.class_boxes == csv.manifest.class_boxes
    assert set(classes["train"]) == {"circle", "square", "triangle"}
    for split in ("train", "val"):
        assert sum(classes[split].values()) == voc.manifest.boxes[split].written


def test_raccoon_voc_and_csv_give_identical_records(raccoon, tmp_path):
    voc = _build(raccoon / "images", raccoon / "annotations", "voc", tmp_path / "voc")
    csv = _build(raccoon / "images", raccoon / "labels" / "raccoon_labels.csv", "csv", tmp_path / "csv")
    for result in (voc, csv):
        m = result.manifest
        assert (m.records_in, m.written_total, m.rejected) == (200, 200, 0)
        assert m.color_modes["L"] == 3
    assert _shard_bytes(tmp_path / "voc") == _shard_bytes(tmp_path / "csv")


def test_coco_crowd_is_difficult_and_orphans_are_rejected():
    doc = {"images": [{"id": 7, "file_name": "sub/a.jpg", "width": 10, "height": 20}],
           "categories": [{"id": 3, "name": "cat"}],
           "annotations": [{"id": 2, "image_id": 7, "category_id": 3, "bbox": [1, 2, 3, 4], "iscrowd": 1},
                           {"id": 1, "image_id": 7, "category_id": 3, "bbox": [0, 0, 5, 5]},
                           {"id": 9, "image_id": 99, "category_id": 3, "bbox": [0, 0, 1, 1]}]}
    out = parse_coco(json.dumps(doc).encode(), "inst.json")
    rejects = [r for r in out if isinstance(r, Reject)]
    (record,) = [r for r in out if isinstance(r, SourceRecord)]
    assert len(rejects) == 1 and "image id 99" in rejects[0].message and rejects[0].source_ref == "inst.json#annotation=9"
    assert record.image_id == "a" and (record.width, record.height) == (10, 20)
    assert [(b.xmin, b.ymin, b.xmax, b.ymax, b.difficult) for b in record.boxes] == [
        (0, 0, 5, 5, False), (1, 2, 4, 6, True)]  # sorted by annotation id


def test_csv_groups_rows_and_rejects_inconsistent_or_short_rows():
    text = ("filename,width,height,class,xmin,ymin,xmax,ymax\n"
            "a.jpg,10,10,cat,1,1,5,5\n"
            "b.jpg,10,10,dog,1,1,5,5\n"
            "a.jpg,10,10,dog,2,2,6,6\n"
            "c.jpg,10,10,cat,1,1\n"
            "d.jpg,10,10,cat,1,1,5,5\n"
            "d.jpg,12,10,cat,1,1,5,5\n")
    out = {r.image_id: r for r in parse_csv(text.encode(), "l.csv")}
    assert [b.class_text for b in out["a"].boxes] == ["cat", "dog"] and out["a"].source_ref == "l.csv:2-4"
    assert isinstance(out["c"], Reject) and "wrong number of columns" in out["c"].message
    assert isinstance(out["d"], Reject) and "disagree on the image size" in out["d"].message


def test_csv_negatives_and_sizes_not_given_are_built(demo_dir, tmp_path):
    """A row with the class and coordinates empty is an image with no boxes; sizes written
    as "nan" (or left empty) on several rows of one image are "not given", not a
    disagreement (NaN != NaN); rows giving a size and rows not giving one do disagree."""
    import csv

    from beam.contract.files import read_manifest, read_rejects
    from beam.contract.rejects import BAD_ANNOTATION

    rows = list(csv.DictReader((demo_dir / "labels.csv").open()))
    names = sorted({r["filename"] for r in rows})
    negative, unsized, mixed = names[:3]
    edited = [r for r in rows if r["filename"] != negative]
    edited.append({**rows[0], "filename": negative, "class": "", "xmin": "", "ymin": "", "xmax": "", "ymax": ""})
    for r in edited:
        if r["filename"] == unsized:
            r["width"] = r["height"] = "nan"
    mixed_rows = [r for r in edited if r["filename"] == mixed]
    edited.append({**mixed_rows[0], "width": "", "height": ""})
    labels = tmp_path / "labels.csv"
    with labels.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(edited)
    assert sum(r["filename"] == unsized for r in edited) > 1  # a disagreement needs two rows
    result = _build(demo_dir / "images", labels, "csv", tmp_path / "out")
    (reject,) = read_rejects(str(tmp_path / "out"))
    assert reject.image_id == Path(mixed).stem and reject.reason == BAD_ANNOTATION
    assert "rows disagree on the image size" in reject.message and "None" in reject.message
    m = read_manifest(str(tmp_path / "out"))
    assert (m.records_in, m.rejected, m.written_total) == (len(names), 1, len(names) - 1)
    boxes_in = sum(c.boxes_in for c in m.boxes.values())
    assert boxes_in == len([r for r in edited if r["class"] and r["filename"] != mixed])
    assert result.manifest == m


def test_voc_reader_reads_difficult_and_missing_numbers(tmp_path):
    xml = tmp_path / "x.xml"
    xml.write_text("<annotation><filename>sub/x.png</filename><size><width>4</width></size>"
                   "<object><name>a</name><difficult>1</difficult><bndbox><xmin>1</xmin><ymin>1</ymin>"
                   "<xmax>3</xmax></bndbox></object></annotation>")
    record = read_voc_file(str(xml))
    assert record.image_id == "x" and record.width == 4 and record.height is None
    assert record.boxes[0].difficult and record.boxes[0].ymax != record.boxes[0].ymax  # NaN
    xml.write_text("<annotation><filename>y.jpg</filename><size><width>0</width><height>0</height></size>"
                   "</annotation>")  # as some labelling tools write it: not given
    assert (read_voc_file(str(xml)).width, read_voc_file(str(xml)).height) == (None, None)


@pytest.mark.parametrize("fmt,name", [("coco", "coco.json"), ("csv", "labels.csv")])
def test_demo_data_files_parse(demo_dir, fmt, name):
    reader = parse_coco if fmt == "coco" else parse_csv
    records = reader((demo_dir / name).read_bytes(), name)
    assert len(records) == 64 and all(isinstance(r, SourceRecord) for r in records)


def test_split_file_assigns_and_rejects_unlisted(demo_dir, tmp_path):
    ids = sorted(p.stem for p in (demo_dir / "annotations").glob("*.xml"))
    split_file = tmp_path / "split.json"
    split_file.write_text(json.dumps({"train": ids[:40], "val": ids[40:60]}))
    result = build_dataset(ConvertOptions(images=str(demo_dir / "images"), annotations=str(demo_dir / "annotations"),
                                          output=str(tmp_path / "out"), split_file=str(split_file)))
    m = result.manifest
    assert m.written == {"train": 40, "val": 20}
    assert m.rejected_by_reason == {"not_in_split_file": 4}
    assert m.split_file == {"listed": 60, "matched": 60, "unknown": 0, "unknown_examples": []}
    assert result.anomalies == []


def test_split_file_ids_that_match_no_image_are_named_and_fail_the_build(demo_dir, tmp_path, capsys):
    from beam.contract.files import read_manifest
    from pipeline.cli import main

    ids = sorted(p.stem for p in (demo_dir / "annotations").glob("*.xml"))
    typos = [f"{ids[0]}x", "img_0007", "BloodImage_0001", "a", "b", "c"]
    split_file = tmp_path / "split.json"
    split_file.write_text(json.dumps({"train": ids[:40] + typos[:3], "val": ids[40:] + typos[3:]}))
    build = ["data", "build", "--format", "voc", "--images", str(demo_dir / "images"), "--annotations",
             str(demo_dir / "annotations"),
             "--split-file", str(split_file), "--output"]
    assert main(build + [str(tmp_path / "strict")]) == 1
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if "ids that match no image" in line)
    assert "6 of the 70 ids" in line and "BloodImage_0001" in line and "(1 more)" in line
    assert "--allow-anomalies" in err
    assert main(build + [str(tmp_path / "allowed"), "--allow-anomalies"]) == 0
    m = read_manifest(str(tmp_path / "allowed"))
    assert m.split_file["unknown"] == 6 and m.split_file["matched"] == 64 == m.written_total
    assert m.split_file["unknown_examples"] == sorted(typos)[:5]
    assert any("ids that match no image" in a for a in m.anomalies)


def test_gzip_shards_are_deterministic_and_readable(demo_dir, tmp_path):
    from components.detector.records import count_records

    for name in ("a", "b"):
        build_dataset(ConvertOptions(images=str(demo_dir / "images"), annotations=str(demo_dir / "annotations"),
                                     output=str(tmp_path / name), gzip=True, val_fraction=0.25))
    a = sorted((tmp_path / "a").glob("*.tfrecord.gz"))
    assert a and [p.read_bytes() for p in a] == [(tmp_path / "b" / p.name).read_bytes() for p in a]
    assert count_records(str(tmp_path / "a"), "train") + count_records(str(tmp_path / "a"), "val") == 64


def test_coco_faults_each_reject_their_image_with_a_reason_that_says_which(demo_dir, tmp_path, capsys):
    """Two entries of 'images' sharing an id (whose annotations are whose cannot be told), an
    annotation of a category_id not in 'categories', and a text file named .jpg: each is a
    reject of the real build, one line naming what is wrong; everything else is written."""
    import shutil

    from beam.contract.files import read_manifest, read_rejects
    from pipeline.cli import main

    doc = json.loads((demo_dir / "coco.json").read_text())
    images = tmp_path / "images"
    shutil.copytree(demo_dir / "images", images)
    first, second, third = doc["images"][:3]
    doc["images"].append({**second, "file_name": "copy.jpg"})  # second's id again
    shutil.copy(images / second["file_name"], images / "copy.jpg")
    doc["annotations"].append({"id": 10_000, "image_id": first["id"], "category_id": 999, "bbox": [1, 1, 5, 5]})
    (images / third["file_name"]).write_text("not a photo")
    (tmp_path / "coco.json").write_text(json.dumps(doc))
    out = tmp_path / "out"
    assert main(["data", "build", "--format", "coco", "--images", str(images), "--annotations",
                 str(tmp_path / "coco.json"), "--output", str(out), "--max-reject-fraction", "0.5"]) == 0
    messages = {r.image_id: (r.reason, r.message) for r in read_rejects(str(out))}
    stem = lambda entry: Path(entry["file_name"]).stem  # noqa: E731
    assert messages == {
        stem(first): ("bad_annotation", "annotation 10000: category_id 999 is not in 'categories'"),
        stem(second): ("bad_annotation", f"image id {second['id']!r} is given to 2 entries of 'images'"),
        "copy": ("bad_annotation", f"image id {second['id']!r} is given to 2 entries of 'images'"),
        stem(third): ("unreadable_image",
                      f"image {third['file_name']!r} cannot be decoded: not an image file (no image format Pillow knows)"),
    }
    m = read_manifest(str(out))
    assert (m.records_in, m.rejected, m.written_total) == (len(doc["images"]), 4, len(doc["images"]) - 4)
    assert "0x" not in capsys.readouterr().err  # no object address in any line


def _images_by_shard(out):
    """{shard: [(source id, image bytes)]}: what was written, whatever the file names said."""
    import tensorflow as tf

    examples = {p.name: [tf.train.Example.FromString(raw.numpy()).features.feature
                         for raw in tf.data.TFRecordDataset(str(p))] for p in sorted(out.glob("*.tfrecord"))}
    return {name: [(f["image/source_id"].bytes_list.value[0], f["image/encoded"].bytes_list.value[0]) for f in shard]
            for name, shard in examples.items()}


def test_file_names_with_the_exporters_folders_or_another_case_are_found(demo_dir, tmp_path):
    """COCO file names as exporters write them (`images/x.jpg`, a Windows path of the labelling
    machine) find the images in --images by their base name, and `x.jpg` finds `x.JPG` (labelled
    on a case-blind disk): the same shards as the plain names. A name found no way is a
    missing_image reject naming the name as written."""
    import shutil

    from beam.contract.files import read_rejects

    images = tmp_path / "images"
    shutil.copytree(demo_dir / "images", images)
    doc = json.loads((demo_dir / "coco.json").read_text())
    upper = [entry["file_name"] for entry in doc["images"][:5]]
    for name in upper:  # the files say .JPG, the annotations .jpg
        (images / name).rename(images / name.replace(".jpg", ".JPG"))
    for i, entry in enumerate(doc["images"]):
        entry["file_name"] = (f"images/{entry['file_name']}" if i % 2 else f"C:\\labels\\{entry['file_name']}")
    doc["images"].append({"id": 10_000, "file_name": "images/nowhere.jpg", "width": 10, "height": 10})
    (tmp_path / "coco.json").write_text(json.dumps(doc))
    plain = _build(demo_dir / "images", demo_dir / "coco.json", "coco", tmp_path / "plain")
    exported = _build(images, tmp_path / "coco.json", "coco", tmp_path / "exported")
    assert _images_by_shard(tmp_path / "exported") == _images_by_shard(tmp_path / "plain")
    assert exported.manifest.written_total == plain.manifest.written_total == len(doc["images"]) - 1
    (missing,) = read_rejects(str(tmp_path / "exported"))
    assert (missing.image_id, missing.reason) == ("nowhere", "missing_image")
    assert "'images/nowhere.jpg' not found" in missing.message


def test_a_file_name_that_leaves_the_images_folder_is_never_read(demo_dir, tmp_path):
    """A hostile COCO export names a photo by `../outside/...` and one by an absolute path, both
    real photos outside --images: each is a reject naming the path, never read into a shard.
    A symlink inside the folder into a cache still works, and the counts reconcile."""
    import shutil

    from beam.contract.files import read_manifest, read_rejects

    images, outside, cache = tmp_path / "images", tmp_path / "outside", tmp_path / "cache"
    shutil.copytree(demo_dir / "images", images)
    outside.mkdir()
    cache.mkdir()
    doc = json.loads((demo_dir / "coco.json").read_text())
    climbing, absolute, linked = (entry["file_name"] for entry in doc["images"][:3])
    (images / climbing).rename(outside / climbing)
    (images / absolute).rename(outside / absolute)
    (images / linked).rename(cache / linked)
    (images / linked).symlink_to(cache / linked)
    doc["images"][0]["file_name"] = f"../outside/{climbing}"
    doc["images"][1]["file_name"] = str(outside / absolute)
    (tmp_path / "coco.json").write_text(json.dumps(doc))
    result = _build(images, tmp_path / "coco.json", "coco", tmp_path / "out")
    rejects = {r.image_id: r for r in read_rejects(str(tmp_path / "out"))}
    assert {r.reason for r in rejects.values()} == {"image_outside_folder"} and len(rejects) == 2
    assert f"'../outside/{climbing}' is outside the images folder" in rejects[Path(climbing).stem].message
    assert f"{str(outside / absolute)!r} is outside the images folder" in rejects[Path(absolute).stem].message
    manifest = read_manifest(str(tmp_path / "out"))
    assert result.manifest.written_total == len(doc["images"]) - 2  # the symlinked photo among them
    assert manifest.rejected_by_reason == {"image_outside_folder": 2} and not manifest.reconcile_problems()


def test_near_duplicate_boxes_are_kept_counted_and_shown(demo_dir, tmp_path, capsys):
    """The same object labelled twice (same class, IoU > 0.8) is a warning with examples, not a reject."""
    import re
    import shutil

    from beam.contract.files import read_manifest
    from pipeline.cli import main

    annotations = tmp_path / "annotations"
    shutil.copytree(demo_dir / "annotations", annotations)
    twice = sorted(annotations.glob("*.xml"))[:2]
    for path in twice:  # the first object again, one pixel lower
        text = path.read_text()
        first = re.search(r"<object>.*?</object>", text, re.S).group(0)
        again = re.sub(r"<ymin>(\d+)</ymin>", lambda m: f"<ymin>{int(m.group(1)) + 1}</ymin>", first)
        path.write_text(text.replace("</annotation>", again + "</annotation>"))
    assert main(["data", "build", "--format", "voc", "--images", str(demo_dir / "images"), "--annotations",
                 str(annotations), "--output", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "2 near-duplicate box pair(s)" in err and twice[0].stem in err and twice[1].stem in err
    m = read_manifest(str(tmp_path / "out"))
    assert m.near_duplicates["pairs"] == 2 and m.rejected == 0
    assert [e.split(":")[0] for e in m.near_duplicates["examples"]] == sorted(p.stem for p in twice)
    assert sum(c.written for c in m.boxes.values()) == sum(c.boxes_in for c in m.boxes.values())


def test_image_formats_reach_training_and_serving_as_the_same_bytes(demo_dir, tmp_path):
    """BMP, an animated GIF, TIFF (one with an EXIF orientation), WEBP and AVIF are written
    as PNG of their (first, upright) frame, and an MPO (the multi-picture JPEG of many
    cameras) as it is: the trainer's decoder reads the pixels Pillow shows, and `serve`'s
    preprocessing gives the model exactly the bytes the shard holds."""
    import io
    import xml.etree.ElementTree as ET

    import numpy as np
    from PIL import Image

    from beam.contract.exif import ORIENTATION_TAG
    from components.detector.records import decode_rgb
    from components.export.predictor import model_image_bytes

    template = sorted((demo_dir / "annotations").glob("*.xml"))[0]
    photo = Image.open(demo_dir / "images" / ET.parse(template).getroot().findtext("filename")).convert("RGB")
    other = photo.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    exif = Image.Exif()
    exif[ORIENTATION_TAG] = 3  # turned by 180 degrees: a viewer shows `photo`
    variants = {"bmp": ("BMP", {}), "gif": ("GIF", {"save_all": True, "append_images": [other]}),
                "tif": ("TIFF", {}), "webp": ("WEBP", {"quality": 90}), "avif": ("AVIF", {}),
                "mpo": ("MPO", {"save_all": True, "append_images": [other]}),
                "turned": ("TIFF", {"exif": exif.tobytes()})}
    images, annotations = tmp_path / "images", tmp_path / "annotations"
    images.mkdir(), annotations.mkdir()
    sources = {}
    for name, (fmt, kwargs) in variants.items():
        buffer = io.BytesIO()
        (photo.rotate(180) if name == "turned" else photo).save(buffer, format=fmt, **kwargs)
        file_name = f"{name}.{'jpg' if fmt == 'MPO' else 'tif' if name == 'turned' else name}"
        (images / file_name).write_bytes(buffer.getvalue())
        sources[name] = buffer.getvalue()
        tree = ET.parse(template)
        tree.getroot().find("filename").text = file_name
        tree.write(annotations / f"{name}.xml")
    assert Image.open(io.BytesIO(sources["mpo"])).format == "MPO"

    result = _build(images, annotations, "voc", tmp_path / "out")
    assert result.manifest.rejected == 0 and result.manifest.written_total == len(variants)
    assert result.manifest.converted_formats == {"AVIF": 1, "BMP": 1, "GIF": 1, "TIFF": 2, "WEBP": 1}
    written = {source_id.decode(): data for shard in _images_by_shard(tmp_path / "out").values()
               for source_id, data in shard}
    for name, data in written.items():
        assert model_image_bytes(sources[name]) == data, name  # serving gives the model the shard's bytes
        shown = np.asarray(Image.open(io.BytesIO(sources[name])).convert("RGB"))  # the first frame
        if name == "turned":
            shown = np.asarray(photo.rotate(180).rotate(180))
        decoded = decode_rgb(data).numpy().astype(int)
        # PNG exactly; a JPEG within the two JPEG decoders' rounding (TensorFlow's and Pillow's)
        assert decoded.shape == shown.shape and np.abs(decoded - shown).max() <= (4 if name == "mpo" else 0), name
        assert data.startswith(b"\xff\xd8" if name == "mpo" else b"\x89PNG"), name
    assert written["mpo"] == sources["mpo"]


def test_voc_without_a_file_name_or_its_suffix_finds_the_image_it_names(demo_dir, tmp_path):
    """A VOC file with no <filename> names the image of its own name, and `000005` (no suffix)
    finds `000005.jpg` or `.PNG`: written under the found file's name. Neither found is a
    missing_image reject that says which suffixes were tried."""
    import shutil
    import xml.etree.ElementTree as ET

    from beam.contract.files import read_rejects

    images, annotations = tmp_path / "images", tmp_path / "annotations"
    images.mkdir(), annotations.mkdir()
    xmls = sorted((demo_dir / "annotations").glob("*.xml"))[:3]
    for xml, (stem, suffix, named) in zip(xmls, [("000005", ".jpg", None), ("scan", ".PNG", "scan"),
                                                  ("gone", ".jpg", "gone")]):
        tree = ET.parse(xml)
        source = demo_dir / "images" / tree.getroot().findtext("filename")
        if stem != "gone":
            shutil.copyfile(source, images / f"{stem}{suffix}")
        if named is None:
            tree.getroot().remove(tree.getroot().find("filename"))
        else:
            tree.getroot().find("filename").text = named
        tree.write(annotations / f"{stem}.xml")
    result = _build(images, annotations, "voc", tmp_path / "out")
    assert (result.manifest.written_total, result.manifest.rejected) == (2, 1)
    names = {source_id.decode() for shard in _images_by_shard(tmp_path / "out").values() for source_id, _ in shard}
    assert names == {"000005", "scan"}
    import tensorflow as tf

    written = {tf.train.Example.FromString(raw.numpy()).features.feature["image/filename"].bytes_list.value[0]
               for shard in (tmp_path / "out").glob("*.tfrecord") for raw in tf.data.TFRecordDataset(str(shard))}
    assert written == {b"000005.jpg", b"scan.PNG"}
    (missing,) = read_rejects(str(tmp_path / "out"))
    assert missing.reason == "missing_image"
    assert missing.message == "image file 'gone' not found (nor with any of .jpg, .jpeg, .png, .bmp, .gif, .tif, " \
                              ".tiff, .webp, .avif, .jfif, .jpe)"


def test_coco_annotations_with_only_a_mask_get_the_box_around_it():
    """Converters that write only `segmentation` (polygons, or an RLE mask as COCO's crowd
    annotations hold) give the box around the mask instead of a box of NaNs (which would be
    dropped, teaching that object as background)."""
    import numpy as np
    from pycocotools import mask as mask_utils

    pixels = np.zeros((40, 60), dtype=np.uint8, order="F")
    pixels[5:15, 30:52] = 1  # rows 5-14, columns 30-51
    rle = mask_utils.encode(pixels)
    rle["counts"] = rle["counts"].decode()  # as JSON holds it
    doc = {"images": [{"id": 1, "file_name": "a.jpg", "width": 60, "height": 40}],
           "categories": [{"id": 1, "name": "cat"}],
           "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "iscrowd": 0,
                            "segmentation": [[2, 3, 12, 3, 12, 9], [20, 25, 24, 30, 21, 31]]},
                           {"id": 2, "image_id": 1, "category_id": 1, "iscrowd": 1, "segmentation": rle},
                           {"id": 3, "image_id": 1, "category_id": 1, "segmentation": []}]}
    (record,) = parse_coco(json.dumps(doc).encode(), "inst.json")
    boxes = [(b.xmin, b.ymin, b.xmax, b.ymax) for b in record.boxes]
    assert boxes[:2] == [(2.0, 3.0, 24.0, 31.0), (30.0, 5.0, 52.0, 15.0)]
    assert all(v != v for v in boxes[2])  # nothing to go by: NaN, an invalid_box the checks drop
    assert record.boxes[1].difficult


def test_normalised_coordinates_fail_the_build_with_the_fix(demo_dir, tmp_path):
    """A CSV whose coordinates are fractions of the image (as YOLO and some exporters write)
    passes every per-box check, box by box; the build fails on it as a dataset anomaly that
    says so, instead of training refusing later for anchors no box can match."""
    lines = (demo_dir / "labels.csv").read_text().splitlines()
    rows = [line.split(",") for line in lines[1:]]
    normalised = [",".join([*row[:4], *(f"{float(v) / 128:.4f}" for v in row[4:])]) for row in rows]
    (tmp_path / "norm.csv").write_text("\n".join([lines[0], *normalised]) + "\n")
    result = _build(demo_dir / "images", tmp_path / "norm.csv", "csv", tmp_path / "out")
    assert not result.ok
    (problem,) = [line for line in result.anomalies if "normalised" in line]
    assert problem.startswith(f"(boxes) | coordinates look normalised | {len(rows)} of {len(rows)} boxes")
    plain = _build(demo_dir / "images", demo_dir / "labels.csv", "csv", tmp_path / "plain")
    assert plain.ok and not any("normalised" in line for line in plain.anomalies)
