"""validate-and-convert on real data (raccoon), on the demo data, and on bad records."""

import io
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import tensorflow as tf
from PIL import Image

from beam.contract import feature_keys as K
from beam.contract.codec import decode_example
from beam.contract.train_keys import TRAIN_KEYS_FILE, read_train_keys
from beam.convert_job import DataBuildError, build_dataset
from beam.options import ConvertOptions, GateOptions
from beam.contract.shards import shard_count


def _records(out: Path) -> dict[str, dict]:
    records = {}
    for shard in sorted(out.glob("*.tfrecord")):
        for raw in tf.data.TFRecordDataset(str(shard)):
            ex = decode_example(raw.numpy())
            records[ex[K.SOURCE_ID][0].decode()] = ex
    return records


@pytest.fixture(scope="module")
def raccoon_out(raccoon, tmp_path_factory):
    out = tmp_path_factory.mktemp("raccoon")
    result = build_dataset(ConvertOptions(images=str(raccoon / "images"),
                                          annotations=str(raccoon / "annotations"), output=str(out)))
    return out, result


def _raccoon_boxes(raccoon) -> int:
    return sum(len(ET.parse(p).getroot().findall("object")) for p in (raccoon / "annotations").glob("*.xml"))


def test_raccoon_all_written_none_rejected(raccoon, raccoon_out):
    out, result = raccoon_out
    m = result.manifest
    assert m.records_in == 200 and m.written_total == 200 and m.rejected == 0
    assert m.written["train"] + m.written["val"] == 200 and m.written["val"] > 0
    assert m.color_modes.get("L") == 3
    assert sum(c.boxes_in for c in m.boxes.values()) == _raccoon_boxes(raccoon) == sum(c.written for c in m.boxes.values())
    assert (out / "rejects-00000-of-00001.jsonl").read_text() == ""
    assert json.loads((out / "label_map.json").read_text()) == {"raccoon": 1}
    assert result.anomalies == []
    for name in ("schema.pbtxt", "stats.html", "manifest.json", "stats-train.pb", "stats-val.pb"):
        assert (out / name).stat().st_size > 0


def test_train_keys_name_the_train_shards_images(raccoon_out):
    """train_keys.txt (what a warm start compares with its champion's) holds the key of every
    train record and of nothing else, read with the contract's reader."""
    out, result = raccoon_out
    keys = {ex[K.KEY_SHA256][0].decode() for shard in out.glob("train-*.tfrecord")
            for ex in map(decode_example, (r.numpy() for r in tf.data.TFRecordDataset(str(shard))))}
    # Raccoon holds two pairs of byte-identical photos: 155 images among its 157 train records.
    assert read_train_keys(str(out)) == keys and len(keys) == result.manifest.written["train"] - 2
    assert (out / TRAIN_KEYS_FILE).read_text() == "".join(f"{k}\n" for k in sorted(keys))


def test_raccoon_boxes_equal_the_xml(raccoon, raccoon_out):
    out, _ = raccoon_out
    records = _records(out)
    assert len(records) == 200
    for xml in sorted((raccoon / "annotations").glob("*.xml")):
        root = ET.parse(xml).getroot()
        w, h = int(root.findtext("size/width")), int(root.findtext("size/height"))
        ex = records[xml.stem]
        assert ex[K.WIDTH] == [w] and ex[K.HEIGHT] == [h]
        objs = root.findall("object")
        assert len(ex[K.XMIN]) == len(objs)
        for i, obj in enumerate(objs):
            for key, tag, size in ((K.XMIN, "xmin", w), (K.YMIN, "ymin", h), (K.XMAX, "xmax", w), (K.YMAX, "ymax", h)):
                assert abs(ex[key][i] - float(obj.findtext(f"bndbox/{tag}")) / size) <= 1e-6
        assert ex[K.CLASS_TEXT] == [b"raccoon"] * len(objs) and ex[K.CLASS_LABEL] == [1] * len(objs)
        assert ex[K.FORMAT] == [b"jpeg"]
        assert ex[K.ENCODED][0] == (raccoon / "images" / root.findtext("filename")).read_bytes()


def test_manifest_hashes_match_and_rerun_is_byte_identical(raccoon, raccoon_out, tmp_path):
    out, result = raccoon_out
    build_dataset(ConvertOptions(images=str(raccoon / "images"), annotations=str(raccoon / "annotations"),
                                 output=str(tmp_path)))
    import hashlib

    shards = result.manifest.shards
    assert {s["name"] for s in shards} == {p.name for p in out.glob("*.tfrecord")}
    for shard in shards:
        data = (out / shard["name"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == shard["sha256"] and len(data) == shard["bytes"]
        assert (tmp_path / shard["name"]).read_bytes() == data
    assert sum(s["records"] for s in shards) == 200
    assert (tmp_path / TRAIN_KEYS_FILE).read_bytes() == (out / TRAIN_KEYS_FILE).read_bytes()


def _image_bytes(mode: str, fmt: str, size=(128, 128)) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, color=1 if mode in ("L", "P") else None).save(buf, format=fmt)
    return buf.getvalue()


def _bad_corpus(demo_dir: Path, root: Path) -> tuple[Path, Path, dict[str, str], dict[str, str]]:
    """The demo data plus one record per problem and per accepted colour mode.

    Returns (images, annotations, expected reject reason by id, expected colour mode by id)."""
    images, annotations = root / "images", root / "annotations"
    shutil.copytree(demo_dir / "images", images)
    shutil.copytree(demo_dir / "annotations", annotations)
    good = sorted(annotations.glob("*.xml"))[0]
    expected: dict[str, str] = {}

    def variant(name: str, reason: str | None, edit, image_bytes: bytes | None = None, ext: str = "jpg",
                filename: str | None = None):
        root_el = ET.parse(good).getroot()
        root_el.find("filename").text = filename or f"{name}.{ext}"
        edit(root_el)
        (annotations / f"{name}.xml").write_bytes(ET.tostring(root_el))
        if image_bytes is not None:
            (images / (filename or f"{name}.{ext}")).write_bytes(image_bytes)
        if reason:
            expected[(filename or name).rsplit(".", 1)[0]] = reason

    def set_text(path: str, value: str):
        return lambda r: setattr(r.find(path), "text", value)

    def drop_objects(r):
        for obj in r.findall("object"):
            r.remove(obj)

    jpeg = (images / ET.parse(good).getroot().findtext("filename")).read_bytes()
    variant("missing", "missing_image", lambda r: None)
    variant("corrupt", "unreadable_image", lambda r: None, image_bytes=b"not an image at all")
    variant("truncated", "unreadable_image", lambda r: None, image_bytes=jpeg[: len(jpeg) // 2])
    variant("icon", "unsupported_format", lambda r: None, image_bytes=_image_bytes("RGB", "ICO"), ext="ico")
    # An iPhone photo: a HEIF file (its ISO media header), which Pillow cannot open, named as such.
    variant("heic", "unsupported_format", lambda r: None, ext="heic",
            image_bytes=b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + bytes(64))
    variant("wrongsize", "size_mismatch", set_text("size/width", "300"), jpeg)
    variant("inverted", "invalid_box", set_text("object/bndbox/xmin", "127"), jpeg)
    variant("zerowidth", "invalid_box", lambda r: (set_text("object/bndbox/xmin", "40")(r),
                                                   set_text("object/bndbox/xmax", "40")(r)), jpeg)
    variant("nan", "invalid_box", set_text("object/bndbox/ymin", "nan"), jpeg)
    variant("outside", "box_outside_image", set_text("object/bndbox/xmax", "200"), jpeg)
    variant("negative", "box_outside_image", set_text("object/bndbox/ymin", "-30"), jpeg)
    variant("noclass", "bad_annotation", set_text("object/name", ""), jpeg)
    variant("empty", "no_boxes", drop_objects, jpeg)
    variant("huge", "image_too_large",
            lambda r: (set_text("size/width", "400")(r), set_text("size/height", "400")(r)),
            _image_bytes("RGB", "JPEG", (400, 400)))
    bomb = io.BytesIO()  # 200 M pixels in 24 kB: over Pillow's decompression-bomb limit, refused unread
    Image.new("1", (20_000, 10_000)).save(bomb, "PNG")
    variant("bomb", "image_too_large",
            lambda r: (set_text("size/width", "20000")(r), set_text("size/height", "10000")(r)),
            bomb.getvalue(), ext="png")
    # A second annotation file for an image id that is already annotated.
    variant("zz-duplicate", None, lambda r: None, filename=ET.parse(good).getroot().findtext("filename"))
    expected[good.stem + "#dup"] = "duplicate_image_id"
    (annotations / "broken.xml").write_text("<annotation><filename>x.jpg</filename")
    expected["broken"] = "bad_annotation"
    # Accepted colour modes: written, and counted in the manifest.
    # A GIF and a TIFF are written as PNG (beam/contract/images.py).
    modes = {"cmyk": ("CMYK", "JPEG", "jpg"), "palette": ("P", "PNG", "png"), "alpha": ("RGBA", "PNG", "png"),
             "grey": ("L", "PNG", "png"), "gif": ("P", "GIF", "gif"), "tiff": ("CMYK", "TIFF", "tif")}
    for name, (mode, fmt, ext) in modes.items():
        variant(name, None, lambda r: None, _image_bytes(mode, fmt), ext=ext)
    return images, annotations, expected, {name: mode for name, (mode, _, _) in modes.items()}


def test_bad_records_rejected_with_reasons_and_counts_reconcile(demo_dir, tmp_path):
    images, annotations, expected, modes = _bad_corpus(demo_dir, tmp_path / "src")
    assert len(set(expected)) >= 15
    out = tmp_path / "out"
    result = build_dataset(ConvertOptions(images=str(images), annotations=str(annotations), output=str(out),
                                          keep_empty=False, max_pixels=100_000, bad_box="reject-image",
                                          gates=GateOptions(max_reject_fraction=1.0)))
    rows = [json.loads(line) for line in (out / "rejects-00000-of-00001.jsonl").read_text().splitlines()]
    got = {}
    for row in rows:
        key = row["image_id"] + ("#dup" if row["reason"] == "duplicate_image_id" else "")
        got[key] = row["reason"]
    assert got == expected
    assert all(r["message"] and "\n" not in r["message"] and r["source"] for r in rows)
    bomb = next(r for r in rows if r["image_id"] == "bomb")
    assert bomb["message"] == "image 'bomb.png': Image size (200000000 pixels) exceeds limit of 178956970 pixels"
    heic = next(r for r in rows if r["image_id"] == "heic")
    assert heic["message"].startswith("image 'heic.heic' is HEIF; accepted: JPEG and PNG")
    dup = next(r for r in rows if r["reason"] == "duplicate_image_id")
    assert dup["source"].endswith("zz-duplicate.xml")
    m = result.manifest
    written_ids = set(_records(out))
    assert written_ids == {p.stem for p in demo_dir.glob("annotations/*.xml")} | set(modes)
    assert m.written_total == len(written_ids) and m.rejected == len(expected)
    assert m.records_in == m.written_total + m.rejected == len(list(annotations.glob("*.xml")))
    assert sum(m.rejected_by_reason.values()) == m.rejected and m.boxes_rejected_by_reason == {}
    for mode in modes.values():
        assert m.color_modes[mode] >= 1
    assert m.converted_formats == {"GIF": 1, "TIFF": 1}


def test_reject_fraction_over_the_limit_fails_unless_allowed(demo_dir, tmp_path):
    images, annotations, expected, _ = _bad_corpus(demo_dir, tmp_path / "src")
    failed = build_dataset(ConvertOptions(images=str(images), annotations=str(annotations), output=str(tmp_path / "a"),
                                          gates=GateOptions(max_reject_fraction=0.05)))
    assert not failed.ok and any("too many rejects" in line for line in failed.anomalies)
    assert "too many rejects" in (tmp_path / "a" / "anomalies.txt").read_text()
    allowed = build_dataset(ConvertOptions(images=str(images), annotations=str(annotations),
                                           output=str(tmp_path / "b"), allow_anomalies=True,
                                           gates=GateOptions(max_reject_fraction=0.05)))
    assert allowed.ok and allowed.anomalies and allowed.manifest.anomalies_allowed


def test_out_of_tolerance_box_is_clipped_within_tolerance(demo_dir, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(demo_dir, src)
    xml = sorted((src / "annotations").glob("*.xml"))[0]
    root = ET.parse(xml).getroot()
    root.find("object/bndbox/xmax").text = "129"  # 1 px past a 128 px image
    xml.write_bytes(ET.tostring(root))
    out = tmp_path / "out"
    build_dataset(ConvertOptions(images=str(src / "images"), annotations=str(src / "annotations"), output=str(out)))
    assert max(_records(out)[xml.stem][K.XMAX]) == 1.0


def test_empty_input_and_unbuilt_format_fail_clearly(tmp_path):
    (tmp_path / "ann").mkdir()
    with pytest.raises(DataBuildError, match="no \\*.xml"):
        build_dataset(ConvertOptions(images=str(tmp_path), annotations=str(tmp_path / "ann"), output=str(tmp_path / "o")))
    with pytest.raises(DataBuildError, match="a.json not found"):
        build_dataset(ConvertOptions(images=str(tmp_path), annotations=str(tmp_path / "a.json"),
                                     output=str(tmp_path / "o"), data_format="coco"))
    (tmp_path / "a.csv").write_text("filename,class\nx.jpg,cat\n")
    with pytest.raises(DataBuildError, match="missing CSV columns width, height"):
        build_dataset(ConvertOptions(images=str(tmp_path), annotations=str(tmp_path / "a.csv"),
                                     output=str(tmp_path / "o"), data_format="csv"))


def test_shards_no_record_goes_to_are_written_empty_and_listed(demo_dir, tmp_path):
    """A hash bucket and a whole split (val, with --val-fraction 0) no record goes to: every
    name -of-N exists, empty (gzip: a gzip stream of nothing), in the manifest with 0 records
    and its real hash; TensorFlow reads every shard."""
    import hashlib

    from beam.contract.shards import shard_index
    from beam.source_records import image_id_from_filename

    by_id = {image_id_from_filename(ET.parse(x).getroot().findtext("filename")): x
             for x in sorted((demo_dir / "annotations").glob("*.xml"))}
    ids = sorted(by_id)
    chosen = next(trio for trio in (ids[i:i + 3] for i in range(len(ids) - 2))
                  if len({shard_index(i, 3) for i in trio}) < 3)  # three records, at most two of three buckets
    images, annotations = tmp_path / "images", tmp_path / "annotations"
    images.mkdir(), annotations.mkdir()
    for image_id in chosen:
        xml = by_id[image_id]
        shutil.copy(xml, annotations / xml.name)
        name = ET.parse(xml).getroot().findtext("filename")
        shutil.copy(demo_dir / "images" / name, images / name)
    out = tmp_path / "out"
    result = build_dataset(ConvertOptions(images=str(images), annotations=str(annotations), output=str(out),
                                          val_fraction=0.0, min_shards=3, gzip=True, allow_anomalies=True))
    shards = result.manifest.shards
    names = [f"train-{i:05d}-of-00003.tfrecord.gz" for i in range(3)] + ["val-00000-of-00001.tfrecord.gz"]
    assert [s["name"] for s in shards] == names == sorted(p.name for p in out.glob("*.tfrecord.gz"))
    assert sum(s["records"] for s in shards) == 3 and sum(s["records"] == 0 for s in shards) >= 2
    for shard in shards:
        data = (out / shard["name"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == shard["sha256"] and len(data) == shard["bytes"]
        read = sum(1 for _ in tf.data.TFRecordDataset(str(out / shard["name"]), compression_type="GZIP"))
        assert read == shard["records"], shard["name"]


def test_shard_count_bounds():
    assert shard_count(1000, 10 * (128 << 20), 128 << 20, 4) == 10
    assert shard_count(3, 100, 128 << 20, 4) == 3
    assert shard_count(1000, 100, 128 << 20, 4) == 4


def test_given_label_map_rejects_unknown_classes(demo_dir, tmp_path):
    out = tmp_path / "out"
    result = build_dataset(ConvertOptions(images=str(demo_dir / "images"), annotations=str(demo_dir / "annotations"),
                                          output=str(out), label_map={"circle": 1, "square": 2}))
    rejects = [json.loads(line) for line in (out / "rejects-00000-of-00001.jsonl").read_text().splitlines()]
    assert rejects and {r["reason"] for r in rejects} == {"unknown_class"}
    assert all("'triangle'" in r["message"] for r in rejects)
    assert json.loads((out / "label_map.json").read_text()) == {"circle": 1, "square": 2}
    labels = {v for ex in _records(out).values() for v in ex[K.CLASS_LABEL]}
    assert labels <= {1, 2}
    assert result.manifest.records_in == result.manifest.written_total + len(rejects)


def test_every_record_rejected_fails_with_pointer_to_rejects(demo_dir, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(DataBuildError, match=r"^no record with a box passed the checks: .*rejects-\*\.jsonl"):
        build_dataset(ConvertOptions(images=str(tmp_path / "no-images-here"),
                                     annotations=str(demo_dir / "annotations"), output=str(out)))
    assert len((out / "rejects-00000-of-00001.jsonl").read_text().splitlines()) == len(list(demo_dir.glob("annotations/*.xml")))
