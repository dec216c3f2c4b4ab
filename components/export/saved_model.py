"""Export a trained detector as a TensorFlow SavedModel that takes encoded image bytes.

The SavedModel has two signatures over one function (`_detections`):
- `serving_default(image_bytes)`: a batch of JPEG/PNG bytes (string `[None]`, any size and
  aspect) → detections with score >= the default threshold, for any TF Serving container;
- `detect(image_bytes, score_threshold)`: the same with the threshold of the request
  (`detpipe serve` and `detpipe predict` use it).
Outputs use the TF Object Detection API names: `detection_boxes` (normalised ymin, xmin,
ymax, xmax on the original image), `detection_scores`, `detection_classes` (1-based
label-map ids), `detection_class_names`, `num_detections`; rows are sorted by score and
padded with zeros past `num_detections`.

Preprocessing is the evaluator's (`records.decode_at_least` then `to_model_image`), and
the detector runs through `detect.detect` (full batches, the last one padded), so the
export answers what the evaluation measured. Beside the SavedModel: `label_map.json` and
`serving_config.json` (default threshold and where it came from, max detections, input
name, image size).

Keras' `ExportArchive` writes it: it tracks the model's variables and traces the endpoints.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, fields

import keras
import tensorflow as tf

from components.detector.detect import detect
from components.detector.records import decode_at_least, decode_rgb, to_model_image
from components.detector.tile_choice import Tiling
from components.detector.tiles import detect_tiled
from components.export.export_files import DEFAULT_SCORE_THRESHOLD, EXPORT_BATCH, LABEL_MAP_FILE, SERVING_CONFIG_FILE

logger = logging.getLogger(__name__)

EXPORT_DIR = "saved_model"  # where `detpipe train` exports, inside its output folder
INPUT_NAME = "image_bytes"  # ends in _bytes: Vertex AI decodes {"b64": ...} for it
DETECT_SIGNATURE = "detect"


@dataclass(frozen=True)
class ServingConfig:
    image_size: int
    score_threshold: float
    threshold_source: str  # "evaluation (max F1 at IoU 0.5)" or "default"
    max_detections: int
    model_batch: int = EXPORT_BATCH  # images the model computes at once (fewer are padded)
    tile_overlap: int | None = None  # a tiled model: photos answered from image_size tiles overlapping this much
    input_name: str = INPUT_NAME
    signature: str = "serving_default"
    detect_signature: str = DETECT_SIGNATURE

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def read(cls, saved_model_dir: str) -> "ServingConfig":
        """The config of an export; fields a later version added are left out (logged), so an
        older server still serves a newer export (this one could not serve `model_batch`'s)."""
        with tf.io.gfile.GFile(f"{saved_model_dir.rstrip('/')}/{SERVING_CONFIG_FILE}") as handle:
            written = json.load(handle)
        later = sorted(set(written) - {f.name for f in fields(cls)})
        if later:
            logger.warning("serving_config.json: leaving out fields of a later version: %s", ", ".join(later))
        return cls(**{k: v for k, v in written.items() if k not in later})


def class_names(label_map: dict[str, int]) -> list[str]:
    """Index = 1-based id; "" at 0 (padding) and at gaps in the ids."""
    names = [""] * (max(label_map.values()) + 1)
    for name, index in label_map.items():
        names[index] = name
    return names


def _whole_photos(model: keras.Model, image_bytes: tf.Tensor, image_size: int) -> dict[str, tf.Tensor]:
    """`detect`'s output for a batch of encoded photos, each resized whole; boxes normalised."""
    images = tf.map_fn(lambda data: to_model_image(decode_at_least(data, image_size), image_size), image_bytes,
                       fn_output_signature=tf.TensorSpec([image_size, image_size, 3], tf.float32))
    out = detect(model, images, EXPORT_BATCH)
    return {**out, "boxes": tf.cast(out["boxes"], tf.float32) / image_size}


def _tiled_photos(model: keras.Model, image_bytes: tf.Tensor, tiling: Tiling) -> dict[str, tf.Tensor]:
    """The same for a tiled model: each photo decoded whole and answered from its tiles at full
    resolution (tiles.detect_tiled, as evaluation does), boxes normalised by the photo's size."""
    limit = model.prediction_decoder.max_detections

    def one(data):
        photo = decode_rgb(data)
        out = detect_tiled(model, photo, tiling, EXPORT_BATCH)
        return {**out, "boxes": out["boxes"] / tf.tile(tf.cast(tf.shape(photo)[:2], tf.float32), [2])}

    return tf.map_fn(one, image_bytes, fn_output_signature={
        "boxes": tf.TensorSpec([limit, 4], tf.float32), "confidence": tf.TensorSpec([limit], tf.float32),
        "labels": tf.TensorSpec([limit], tf.int32), "num_detections": tf.TensorSpec([], tf.int32)})


def _detections(model: keras.Model, image_bytes: tf.Tensor, score_threshold: tf.Tensor, image_size: int,
                class_names: tf.Tensor, tiling: Tiling | None = None) -> dict[str, tf.Tensor]:
    out = (_tiled_photos(model, image_bytes, tiling) if tiling is not None
           else _whole_photos(model, image_bytes, image_size))
    slots = tf.range(tf.shape(out["confidence"])[1])[tf.newaxis, :]
    scores = tf.cast(out["confidence"], tf.float32)
    keep = (slots < tf.cast(out["num_detections"], tf.int32)[:, tf.newaxis]) & (scores >= score_threshold)
    order = tf.argsort(tf.where(keep, scores, -1.0), axis=1, direction="DESCENDING", stable=True)
    keep = tf.gather(keep, order, batch_dims=1)
    boxes = tf.clip_by_value(tf.gather(out["boxes"], order, batch_dims=1), 0.0, 1.0)
    classes = tf.cast(tf.gather(out["labels"], order, batch_dims=1), tf.int32) + 1
    classes = tf.where(keep, classes, 0)
    return {
        "detection_boxes": tf.where(keep[..., tf.newaxis], boxes, 0.0),
        "detection_scores": tf.where(keep, tf.gather(scores, order, batch_dims=1), 0.0),
        "detection_classes": classes,
        "detection_class_names": tf.gather(class_names, classes),
        "num_detections": tf.reduce_sum(tf.cast(keep, tf.int32), axis=1),
    }


def export_saved_model(model: keras.Model, label_map: dict[str, int], image_size: int, output_dir: str,
                       score_threshold: float = DEFAULT_SCORE_THRESHOLD, threshold_source: str = "default",
                       max_detections: int = 100, tiling: Tiling | None = None) -> ServingConfig:
    """Write the SavedModel, `label_map.json` and `serving_config.json` to `output_dir`; with a
    `tiling`, the SavedModel answers each photo from its tiles at full resolution."""
    if not 0.0 <= score_threshold <= 1.0:
        raise ValueError(f"the score threshold must be in [0, 1], got {score_threshold}")
    names = tf.constant(class_names(label_map))
    archive = keras.export.ExportArchive()
    archive.track(model)
    bytes_spec = tf.TensorSpec([None], tf.string, name=INPUT_NAME)
    threshold_spec = tf.TensorSpec([], tf.float32, name="score_threshold")
    # Both signatures call this one function, so the model's graph is traced once where it
    # was traced for each (Keras's write_out traces every endpoint, then tf.saved_model.save
    # traces them again in its save context: four traces of the model became two, 6 of a
    # tiny model's 24 s export).
    detections = tf.function(
        lambda image_bytes, score_threshold: _detections(model, image_bytes, score_threshold, image_size, names,
                                                         tiling),
        input_signature=[bytes_spec, threshold_spec], autograph=False)
    default = tf.constant(score_threshold, tf.float32)
    archive.add_endpoint("serving_default", lambda image_bytes: detections(image_bytes, default),
                         input_signature=[bytes_spec])
    archive.add_endpoint(DETECT_SIGNATURE, detections, input_signature=[bytes_spec, threshold_spec])
    archive.write_out(output_dir, verbose=False)
    config = ServingConfig(image_size=image_size, score_threshold=float(score_threshold),
                           threshold_source=threshold_source, max_detections=max_detections,
                           tile_overlap=tiling.overlap if tiling is not None else None)
    out = output_dir.rstrip("/")
    with tf.io.gfile.GFile(f"{out}/{LABEL_MAP_FILE}", "w") as handle:
        handle.write(json.dumps(label_map, indent=2, sort_keys=True) + "\n")
    with tf.io.gfile.GFile(f"{out}/{SERVING_CONFIG_FILE}", "w") as handle:
        handle.write(json.dumps(config.to_dict(), indent=2) + "\n")
    logger.info("export: SavedModel with signatures serving_default(%s) and %s -> %s", INPUT_NAME,
                DETECT_SIGNATURE, output_dir)
    return config


def export_trained(model_dir: str, output_dir: str, score_threshold: float | None = None,
                   threshold_source: str = "given") -> ServingConfig:
    """`detpipe export`: the output of `detpipe train` → a SavedModel. The default threshold is
    `score_threshold` when given (`threshold_source` says where from: the one `detpipe evaluate`
    chose is `chosen_threshold` of its metrics.json), else DEFAULT_SCORE_THRESHOLD."""
    from components.detector.artifacts import load_trained

    model, config = load_trained(model_dir)
    source = threshold_source
    if score_threshold is None:
        score_threshold, source = DEFAULT_SCORE_THRESHOLD, "default"
    return export_saved_model(model, config.label_map, config.image_size, output_dir,
                              score_threshold=score_threshold, threshold_source=source,
                              max_detections=config.max_detections, tiling=config.tiling)
