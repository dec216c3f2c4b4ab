"""Phone photos: every EXIF orientation, annotated as displayed (CVAT, Label Studio,
Roboflow) or as stored (LabelImg), ends up in a shard whose decoded pixels put each box
on its object. TensorFlow's decoder ignores EXIF, as training does."""

import io
import json

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from beam.contract import feature_keys as K
from beam.contract.codec import decode_example
from beam.contract.exif import ORIENTATION_TAG, upright
from beam.contract.rejects import SIZE_MISMATCH
from beam.convert_job import build_dataset
from beam.options import ConvertOptions
from beam.record_checks import CheckOptions, check_record
from beam.source_records import SourceBox, SourceRecord
from pipeline.demo_data import DemoObject, coco_instances, csv_rows, voc_xml

# What turns the displayed image into the stored pixels for each orientation (the inverse
# of what a viewer applies).
TO_STORED = {1: None, 2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
             4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_90,
             7: Image.Transpose.TRANSVERSE, 8: Image.Transpose.ROTATE_270}
RED = (220, 20, 20)


def _picture(width, height, box) -> Image.Image:
    image = Image.new("RGB", (width, height), (128, 128, 128))
    image.paste(RED, box)
    return image


def _jpeg(image: Image.Image, orientation: int) -> bytes:
    exif = Image.Exif()
    if orientation != 1:
        exif[ORIENTATION_TAG] = orientation
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=95, exif=exif.tobytes())
    return out.getvalue()


def _phone_photo(orientation, width, height, box, annotated_as) -> tuple[bytes, int, int, tuple]:
    """(JPEG bytes, annotated width, annotated height, annotated box) of a photo whose red
    object is at `box` in the frame it was annotated in."""
    if annotated_as == "stored":
        return _jpeg(_picture(width, height, box), orientation), width, height, box
    displayed = _picture(width, height, box)
    stored = displayed.transpose(TO_STORED[orientation]) if TO_STORED[orientation] else displayed
    data = _jpeg(stored, orientation)
    assert upright(Image.open(io.BytesIO(data))).size == (width, height)  # the test's own premise
    return data, width, height, box


def _dataset(root, photos: dict, fmt="voc"):
    """Write photos {stem: (bytes, w, h, box)} with annotations in `fmt`; returns
    (images dir, annotations path)."""
    (root / "images").mkdir(parents=True)
    (root / "annotations").mkdir()
    entries = []
    for stem, (data, width, height, box) in photos.items():
        (root / "images" / f"{stem}.jpg").write_bytes(data)
        objects = [DemoObject("square", box)]
        (root / "annotations" / f"{stem}.xml").write_bytes(voc_xml(f"{stem}.jpg", width, height, objects))
        entries.append((f"{stem}.jpg", width, height, objects))
    (root / "coco.json").write_text(json.dumps(coco_instances(entries)))
    (root / "labels.csv").write_text(csv_rows(entries))
    annotations = {"voc": root / "annotations", "coco": root / "coco.json", "csv": root / "labels.csv"}[fmt]
    return root / "images", annotations


def _build(tmp_path, name, photos, exif="auto", fmt="voc"):
    images, annotations = _dataset(tmp_path / name, photos, fmt)
    out = tmp_path / f"{name}-shards"
    result = build_dataset(ConvertOptions(images=str(images), annotations=str(annotations), output=str(out),
                                          data_format=fmt, val_fraction=0.0, exif=exif, allow_anomalies=True))
    return out, result.manifest.to_dict()


def _shard_images(out) -> dict[str, tuple[np.ndarray, list]]:
    """{image id: (pixels as TF decodes them, [pixel boxes xmin, ymin, xmax, ymax])}"""
    found = {}
    for shard in sorted(out.glob("train-*.tfrecord")):
        for raw in tf.data.TFRecordDataset(str(shard)):
            ex = decode_example(raw.numpy())
            pixels = tf.io.decode_image(ex[K.ENCODED][0], channels=3).numpy()
            h, w = pixels.shape[:2]
            assert (ex[K.WIDTH][0], ex[K.HEIGHT][0]) == (w, h)
            boxes = [(x0 * w, y0 * h, x1 * w, y1 * h)
                     for x0, y0, x1, y1 in zip(ex[K.XMIN], ex[K.YMIN], ex[K.XMAX], ex[K.YMAX])]
            found[ex[K.SOURCE_ID][0].decode()] = (pixels, boxes)
    return found


def _box_lies_on_its_object(pixels, box) -> bool:
    x0, y0, x1, y1 = (int(round(v)) for v in box)
    inside = pixels[y0 + 2:y1 - 2, x0 + 2:x1 - 2].reshape(-1, 3).mean(axis=0)
    return inside[0] > 170 and inside[1] < 80 and inside[2] < 80


BOX = (30, 10, 50, 25)  # in a 80 x 40 frame: off-centre, so any wrong turn or flip misses it


def test_every_orientation_annotated_either_way_puts_each_box_on_its_object(tmp_path):
    photos = {f"displayed-{o}": _phone_photo(o, 80, 40, BOX, "displayed") for o in range(1, 9)}
    # Annotated on the stored pixels: the size tells auto when the orientation turns by 90 degrees.
    photos |= {f"stored-{o}": _phone_photo(o, 80, 40, BOX, "stored") for o in range(5, 9)}
    out, manifest = _build(tmp_path, "auto", photos)
    assert manifest["written_total"] == len(photos) and manifest["rejected"] == 0
    assert manifest["exif_orientation"] == {"mode": "auto", "applied": 7, "ignored": 4}
    shards = _shard_images(out)
    for name, (pixels, boxes) in shards.items():
        assert len(boxes) == 1 and _box_lies_on_its_object(pixels, boxes[0]), name
    assert shards["displayed-6"][0].shape[:2] == (40, 80)  # written upright: height 40, width 80
    assert shards["stored-6"][0].shape[:2] == (40, 80)  # the stored pixels, as annotated


def test_flips_and_half_turns_annotated_on_stored_pixels_need_exif_ignore(tmp_path):
    """Orientations 2-4 keep the size: auto cannot tell and writes them as displayed;
    --exif ignore keeps what LabelImg annotated."""
    photos = {f"stored-{o}": _phone_photo(o, 80, 40, BOX, "stored") for o in range(1, 9)}
    out, manifest = _build(tmp_path, "ignore", photos, exif="ignore")
    assert manifest["exif_orientation"] == {"mode": "ignore", "applied": 0, "ignored": 7}
    for name, (pixels, boxes) in _shard_images(out).items():
        assert _box_lies_on_its_object(pixels, boxes[0]), name


@pytest.mark.parametrize("mode, written_as", [("auto", "displayed"), ("apply", "displayed"), ("ignore", "stored")])
def test_square_images_follow_the_exif_mode(tmp_path, mode, written_as):
    box = (5, 30, 25, 55)
    data, width, height, _ = _phone_photo(6, 60, 60, box, "displayed")
    out, manifest = _build(tmp_path, mode, {"square": (data, width, height, box)}, exif=mode)
    pixels, boxes = _shard_images(out)["square"]
    stored = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    expected = np.asarray(upright(Image.open(io.BytesIO(data))).convert("RGB")) if written_as == "displayed" else stored
    assert np.abs(pixels.astype(int) - expected.astype(int)).mean() < 3
    assert _box_lies_on_its_object(pixels, boxes[0]) == (written_as == "displayed")
    assert manifest["exif_orientation"]["applied" if written_as == "displayed" else "ignored"] == 1


@pytest.mark.parametrize("fmt", ["coco", "csv"])
def test_coco_and_csv_behave_as_voc(tmp_path, fmt):
    photos = {"displayed-6": _phone_photo(6, 80, 40, BOX, "displayed"),
              "stored-8": _phone_photo(8, 80, 40, BOX, "stored"),
              "displayed-3": _phone_photo(3, 80, 40, BOX, "displayed")}
    out, manifest = _build(tmp_path, fmt, photos, fmt=fmt)
    voc_out, _ = _build(tmp_path, f"{fmt}-voc", photos, fmt="voc")
    assert manifest["exif_orientation"] == {"mode": "auto", "applied": 2, "ignored": 1}
    for name, (pixels, boxes) in _shard_images(out).items():
        assert _box_lies_on_its_object(pixels, boxes[0]), name
    shas = [json.loads((o / "manifest.json").read_text())["shards"] for o in (out, voc_out)]
    assert [s["sha256"] for s in shas[0]] == [s["sha256"] for s in shas[1]]  # byte-identical to VOC


def test_upright_shards_are_byte_identical_across_runs(tmp_path):
    photos = {f"displayed-{o}": _phone_photo(o, 80, 40, BOX, "displayed") for o in (3, 6, 8)}
    first, _ = _build(tmp_path, "first", photos)
    again = build_dataset(ConvertOptions(images=str(tmp_path / "first" / "images"),
                                         annotations=str(tmp_path / "first" / "annotations"),
                                         output=str(tmp_path / "again"), val_fraction=0.0, allow_anomalies=True))
    assert [s["sha256"] for s in json.loads((first / "manifest.json").read_text())["shards"]] == \
        [s["sha256"] for s in again.manifest.shards]


def _record(width, height):
    return SourceRecord("p", "p.jpg", width, height, (SourceBox("square", 1, 1, 5, 5),), "p.xml")


def test_a_true_size_mismatch_names_the_orientation():
    data = _jpeg(_picture(200, 100, (10, 10, 20, 20)), 6)
    reject = check_record(_record(150, 300), data, CheckOptions())
    assert reject.reason == SIZE_MISMATCH
    assert reject.message == "annotation says 150x300, image is 200x100 (EXIF orientation 6 would make it 100x200)"
    ignored = check_record(_record(100, 200), data, CheckOptions(exif="ignore"))
    assert ignored.message == ("annotation says 100x200, image is 200x100 (EXIF orientation 6 would make it "
                               "100x200, but --exif ignore keeps the stored pixels)")
    plain = check_record(_record(150, 300), _jpeg(_picture(200, 100, (10, 10, 20, 20)), 1), CheckOptions())
    assert plain.message == "annotation says 150x300, image is 200x100"
    applied = check_record(_record(100, 200), data, CheckOptions())
    assert (applied.width, applied.height, applied.orientation_applied) == (100, 200, True)
    assert "exif_orientation:6:applied" in applied.notes


def test_an_unknown_exif_mode_is_refused():
    with pytest.raises(ValueError, match="--exif must be one of auto, apply, ignore"):
        CheckOptions(exif="rotate")
