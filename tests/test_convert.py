"""validate-and-convert on real data (raccoon), on the demo data, and on bad records."""

import io
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import tensorflow as tf
from PIL import Image

from beam import feature_keys as K
from beam.convert_job import ConvertOptions, DataBuildError, build_dataset
from beam.example_codec import decode_example
from beam.shard_writer import shard_count


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


def test_raccoon_all_written_none_rejected(raccoon_out):
    out, result = raccoon_out
    m = result.manifest
    assert m["records_in"] == 200 and m["written_total"] == 200 and m["rejected"] == 0
    assert m["written"]["train"] + m["written"]["val"] == 200 and m["written"]["val"] > 0
    assert m["color_modes"].get("L") == 3
    assert (out / "rejects.jsonl").read_text() == ""
    assert json.loads((out / "label_map.json").read_text()) == {"raccoon": 1}
    assert result.anomalies == []
    for name in ("schema.pbtxt", "stats.html", "manifest.json", "stats-train.pb", "stats-val.pb"):
        assert (out / name).stat().st_size > 0


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

    shards = result.manifest["shards"]
    assert {s["name"] for s in shards} == {p.name for p in out.glob("*.tfrecord")}
    for shard in shards:
        data = (out / shard["name"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == shard["sha256"] and len(data) == shard["bytes"]
        assert (tmp_path / shard["name"]).read_bytes() == data
    assert sum(s["records"] for s in shards) == 200


def _bad_corpus(demo_dir: Path, root: Path) -> tuple[Path, Path, dict[str, str]]:
    """The demo data plus one bad record per problem; returns (images, annotations, expected)."""
    images, annotations = root / "images", root / "annotations"
    shutil.copytree(demo_dir / "images", images)
    shutil.copytree(demo_dir / "annotations", annotations)
    good = sorted(annotations.glob("*.xml"))[0]
    expected = {}

    def variant(name: str, reason: str, edit, image_bytes: bytes | None = None, ext: str = "jpg"):
        root_el = ET.parse(good).getroot()
        root_el.find("filename").text = f"{name}.{ext}"
        edit(root_el)
        (annotations / f"{name}.xml").write_bytes(ET.tostring(root_el))
        if image_bytes is not None:
            (images / f"{name}.{ext}").write_bytes(image_bytes)
        expected[name] = reason

    jpeg = (images / ET.parse(good).getroot().findtext("filename")).read_bytes()
    buf = io.BytesIO()
    Image.new("RGB", (128, 128)).save(buf, format="GIF")
    variant("missing", "missing_image", lambda r: None)
    variant("corrupt", "unreadable_image", lambda r: None, image_bytes=b"not an image at all")
    variant("truncated", "unreadable_image", lambda r: None, image_bytes=jpeg[: len(jpeg) // 2])
    variant("gif", "unsupported_format", lambda r: None, image_bytes=buf.getvalue(), ext="gif")
    variant("wrongsize", "size_mismatch", lambda r: setattr(r.find("size/width"), "text", "300"), jpeg)
    variant("inverted", "invalid_box", lambda r: setattr(r.find("object/bndbox/xmin"), "text", "127"), jpeg)
    variant("nan", "invalid_box", lambda r: setattr(r.find("object/bndbox/ymin"), "text", "nan"), jpeg)
    variant("outside", "box_outside_image", lambda r: setattr(r.find("object/bndbox/xmax"), "text", "200"), jpeg)
    variant("noclass", "bad_annotation", lambda r: setattr(r.find("object/name"), "text", ""), jpeg)
    (annotations / "broken.xml").write_text("<annotation><filename>x.jpg</filename")
    expected["broken"] = "bad_annotation"
    return images, annotations, expected


def test_bad_records_rejected_with_reasons_and_counts_reconcile(demo_dir, tmp_path):
    images, annotations, expected = _bad_corpus(demo_dir, tmp_path / "src")
    out = tmp_path / "out"
    result = build_dataset(ConvertOptions(images=str(images), annotations=str(annotations), output=str(out)))
    rejects = {r["image_id"]: r for r in map(json.loads, (out / "rejects.jsonl").read_text().splitlines())}
    assert {k: v["reason"] for k, v in rejects.items()} == expected
    assert all(r["message"] and "\n" not in r["message"] and r["source"] for r in rejects.values())
    m = result.manifest
    num_good = len(list(demo_dir.glob("annotations/*.xml")))
    assert m["written_total"] == num_good and m["rejected"] == len(expected)
    assert m["records_in"] == m["written_total"] + m["rejected"]
    assert sum(m["rejected_by_reason"].values()) == m["rejected"]
    assert set(_records(out)) == {p.stem for p in demo_dir.glob("annotations/*.xml")}


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
    with pytest.raises(NotImplementedError, match="coco"):
        build_dataset(ConvertOptions(images=str(tmp_path), annotations=str(tmp_path / "a.json"),
                                     output=str(tmp_path / "o"), format="coco"))


def test_shard_count_bounds():
    assert shard_count(1000, 10 * (128 << 20), 128 << 20, 4) == 10
    assert shard_count(3, 100, 128 << 20, 4) == 3
    assert shard_count(1000, 100, 128 << 20, 4) == 4


def test_given_label_map_rejects_unknown_classes(demo_dir, tmp_path):
    out = tmp_path / "out"
    result = build_dataset(ConvertOptions(images=str(demo_dir / "images"), annotations=str(demo_dir / "annotations"),
                                          output=str(out), label_map={"circle": 1, "square": 2}))
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert rejects and {r["reason"] for r in rejects} == {"unknown_class"}
    assert all("'triangle'" in r["message"] for r in rejects)
    assert json.loads((out / "label_map.json").read_text()) == {"circle": 1, "square": 2}
    labels = {v for ex in _records(out).values() for v in ex[K.CLASS_LABEL]}
    assert labels <= {1, 2}
    assert result.manifest["records_in"] == result.manifest["written_total"] + len(rejects)


def test_every_record_rejected_fails_with_pointer_to_rejects(demo_dir, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(DataBuildError, match="rejects.jsonl"):
        build_dataset(ConvertOptions(images=str(tmp_path / "no-images-here"),
                                     annotations=str(demo_dir / "annotations"), output=str(out)))
    assert len((out / "rejects.jsonl").read_text().splitlines()) == len(list(demo_dir.glob("annotations/*.xml")))
