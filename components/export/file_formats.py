"""The files `detpipe export --format` converts a trained detector to, in a module without
TensorFlow: the command line checks a format and `predict` a file's suffix before anything loads.

Each file takes one image, `[1, S, S, 3]` float32 in [0, 1] at the model's input size S (what
`records.to_model_image` makes of a decoded photo: resized, divided by 255), and answers with the
model's own decoding and non-maximum suppression: `boxes` `[1, N, 4]` (ymin, xmin, ymax, xmax in
pixels of the S x S input), `scores` `[1, N]`, `classes` `[1, N]` (0-based label-map order) and
`num_detections` `[1]`; rows past `num_detections` are padding. The INT8 file is the exception:
it answers with the network's raw outputs, and DECODER_FILE beside it (float, builtin ops) turns
them into those four (see int8_file.py for why).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

SAVED_MODEL = "saved_model"
# How far below the trained model's mAP@[.5:.95] a converted file may score on the same val
# images and still pass (settings of `detpipe export`: --max-map-loss, --max-int8-map-loss).
FLOAT_TOLERANCE = 0.02
INT8_TOLERANCE = 0.05
# Train images the INT8 conversion calibrates its value ranges on (--calibration-images).
CALIBRATION_IMAGES = 100
INPUT_NAME = "image"
OUTPUT_NAMES = ("boxes", "scores", "classes", "num_detections")
RAW_OUTPUT_NAMES = ("bbox_regression", "cls_logits")  # the network's own, before decoding
DECODER_FILE = "decode.tflite"
ONNX_OPSET = 17


@dataclass(frozen=True)
class FileFormat:
    kind: str
    file_name: str
    what: str
    int8: bool = False

    @property
    def suffix(self) -> str:
        return self.file_name[self.file_name.rindex("."):]


FORMATS = {f.kind: f for f in (
    FileFormat("tflite", "model.tflite", "TFLite, float32 weights"),
    FileFormat("tflite-fp16", "model-fp16.tflite", "TFLite, float16 weights"),
    FileFormat("tflite-int8", "model-int8.tflite", f"TFLite, full-integer INT8, with {DECODER_FILE}", int8=True),
    FileFormat("onnx", "model.onnx", f"ONNX opset {ONNX_OPSET}, float32"),
)}
SUFFIXES = tuple(sorted({f.suffix for f in FORMATS.values()}))


EXPORT_FORMATS = (SAVED_MODEL, *FORMATS)


# The export step's settings are its pipeline parameters under this prefix (export_formats, ...).
SETTINGS_PREFIX = "export_"


def _setting(default, help: str, flag: str = ""):
    """A field of ExportSettings: its default, the help the pipeline's parameter shows, and the
    option of `detpipe export` when it is not the field's name (--max-map-loss)."""
    return field(default=default, metadata={"help": help, "flag": flag})


@dataclass(frozen=True)
class ExportSettings:
    """The export step's settings, declared once: the pipeline's `export_*` parameters
    (pipeline/params.py), the export step's inputs and `detpipe export`'s options are made from
    these fields; a new setting is a field here and its use."""

    formats: str = _setting(SAVED_MODEL, f"Files to export, comma-separated: {', '.join(EXPORT_FORMATS)}. The "
                            "SavedModel is always written; each other file is re-scored on val and kept only within "
                            "its mAP tolerance.", flag="--format")
    max_map_loss: float = _setting(FLOAT_TOLERANCE, "How far below the trained model's mAP@[.5:.95] a float file "
                                   "may score on val and still be kept.")
    max_int8_map_loss: float = _setting(INT8_TOLERANCE, "The same for the INT8 file.")
    calibration_images: int = _setting(CALIBRATION_IMAGES, "Train images the INT8 file's value ranges are "
                                       "calibrated on.")

    @classmethod
    def from_parameters(cls, values: dict) -> "ExportSettings":
        """The settings from `export_*` parameter values (the export step's inputs, a command's
        options).

        >>> ExportSettings.from_parameters({"export_formats": "saved_model,onnx"}).formats
        'saved_model,onnx'
        """
        return cls(**{name.removeprefix(SETTINGS_PREFIX): value for name, value in values.items()})

    def converted(self) -> list[str]:
        """The files to convert: the formats asked for but the SavedModel."""
        return [kind for kind in parse_formats(self.formats) if kind != SAVED_MODEL]


def parse_formats(value: str) -> list[str]:
    """`saved_model,tflite` → the formats, each known, in the order given."""
    kinds = [kind.strip() for kind in value.split(",") if kind.strip()]
    unknown = [kind for kind in kinds if kind not in EXPORT_FORMATS]
    if unknown or not kinds:
        raise ValueError(f"formats are {', '.join(EXPORT_FORMATS)} (comma-separated), got {value!r}")
    return list(dict.fromkeys(kinds))


def tolerance(kind: str, float_tolerance: float = FLOAT_TOLERANCE, int8_tolerance: float = INT8_TOLERANCE) -> float:
    return int8_tolerance if FORMATS[kind].int8 else float_tolerance


def decoder_path(int8_file: str) -> str:
    """Where DECODER_FILE lies for an INT8 file: beside it."""
    return os.path.join(os.path.dirname(os.path.abspath(int8_file)), DECODER_FILE)


def is_model_file(path: str) -> bool:
    """A file `export` converts (`predict --model FILE`), as opposed to a SavedModel folder."""
    return path.endswith(SUFFIXES)


def export_folder(model: str) -> str:
    """The export's folder (label_map.json, serving_config.json) of a `--model`: the SavedModel
    folder itself, or the folder of a converted file; local or gs://.

    >>> export_folder("out/exported/"), export_folder("gs://b/exported/model.onnx"), export_folder("model.tflite")
    ('out/exported', 'gs://b/exported', '.')
    """
    return (model.rpartition("/")[0] or ".") if is_model_file(model) else model.rstrip("/")
