"""Shards from the TF Object Detection API's own converters train and evaluate unchanged.

The writer below is written from the OD API's `create_pascal_tf_record.py` conventions
(feature keys, sharded `train.record-0000N-of-0000M` names, `label_map.pbtxt`), and uses
none of detpipe's code, so a change to detpipe's keys or names cannot go unnoticed.
"""

import io
import json

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageDraw

CLASSES = {1: "circle", 3: "square"}  # ids with a gap, as OD API label maps may have


def _example(index: int, rng: np.random.Generator) -> tf.train.Example:
    width, height = 96, 80
    image = Image.new("RGB", (width, height), (40, 40, 40))
    draw = ImageDraw.Draw(image)
    xmin, ymin, xmax, ymax, labels = [], [], [], [], []
    for _ in range(int(rng.integers(1, 3))):
        label = int(rng.choice(list(CLASSES)))
        x0, y0 = int(rng.integers(0, width - 40)), int(rng.integers(0, height - 40))
        size = int(rng.integers(26, 40))
        (draw.ellipse if label == 1 else draw.rectangle)((x0, y0, x0 + size, y0 + size), fill=(220, 180, 30))
        xmin.append(x0 / width), ymin.append(y0 / height)
        xmax.append((x0 + size) / width), ymax.append((y0 + size) / height)
        labels.append(label)
    buf = io.BytesIO()
    image.save(buf, format="JPEG")

    def b(values):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))

    def f(values):
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))

    def i(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    name = f"img{index:03d}.jpg".encode()
    return tf.train.Example(features=tf.train.Features(feature={
        "image/height": i([height]), "image/width": i([width]),
        "image/filename": b([name]), "image/source_id": b([name]),
        "image/encoded": b([buf.getvalue()]), "image/format": b([b"jpeg"]),
        "image/object/bbox/xmin": f(xmin), "image/object/bbox/xmax": f(xmax),
        "image/object/bbox/ymin": f(ymin), "image/object/bbox/ymax": f(ymax),
        "image/object/class/text": b([CLASSES[c].encode() for c in labels]),
        "image/object/class/label": i(labels),
    }))


def write_od_api_dataset(folder, num_train=24, num_val=8, num_shards=2):
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for shard in range(num_shards):
        with tf.io.TFRecordWriter(str(folder / f"train.record-{shard:05d}-of-{num_shards:05d}")) as writer:
            for index in range(shard, num_train, num_shards):
                writer.write(_example(index, rng).SerializeToString())
    with tf.io.TFRecordWriter(str(folder / "val.record")) as writer:
        for index in range(num_train, num_train + num_val):
            writer.write(_example(index, rng).SerializeToString())
    (folder / "label_map.pbtxt").write_text(
        "".join(f"item {{\n  id: {k}\n  name: '{v}'\n}}\n" for k, v in CLASSES.items()))


@pytest.mark.slow  # trains a model: `make test` runs it, `make test-fast` not
def test_od_api_shards_train_and_evaluate_without_change(tmp_path):
    from components.detector.records import count_records
    from components.evaluate.evaluator import evaluate_detector
    from components.train.trainer import TrainConfig, train_detector

    data = tmp_path / "odapi"
    write_od_api_dataset(data)
    assert count_records(str(data), "train") == 24 and count_records(str(data), "val") == 8
    result = train_detector(TrainConfig(data_dir=str(data), output_dir=str(tmp_path / "model"), epochs=1,
                                        batch_size=4, image_size=128, max_steps=4))
    assert result.num_train == 24 and np.isfinite(result.final_loss) and result.final_loss > 0  # boxes matched anchors
    config = json.loads((tmp_path / "model" / "train_config.json").read_text())
    assert config["label_map"] == {"circle": 1, "square": 3}
    assert config["model"]["num_classes"] == 3  # a slot for every id up to the largest
    metrics = evaluate_detector(str(tmp_path / "model"), str(data), str(tmp_path / "eval"), min_map=0.0)
    assert metrics.num_images == 8
    saved = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert {"AP/circle", "AP/square"} <= set(saved["metrics"])


def test_pbtxt_label_maps_are_read_and_bad_ones_named(tmp_path):
    import pytest

    from beam.contract.label_map import parse_pbtxt_label_map

    text = 'item {\n  name: "cat"\n  id: 1\n  display_name: "Cat"\n}\nitem { id: 2 display_name: "dog" }\n'
    assert parse_pbtxt_label_map(text) == {"cat": 1, "dog": 2}
    with pytest.raises(ValueError, match="item 1 needs a name and an id"):
        parse_pbtxt_label_map("item { name: 'cat' }")
    with pytest.raises(ValueError, match="no `item"):
        parse_pbtxt_label_map("")
