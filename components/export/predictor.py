"""Predictions from an exported SavedModel: the export's reader, beside its writer
(saved_model.py). What `detpipe serve`, `detpipe predict`, the batch job and the evaluate step's
re-scoring of the champion share, so they all give the same answers.

Each image is checked before it reaches the model (an image format the data step takes,
fully decodable, not empty); a phone photo with an EXIF orientation is turned upright first
(beam/contract/exif.py), as the data step writes photos annotated the way a person sees them, and a
BMP, GIF, TIFF, WEBP or AVIF is converted to PNG, as the data step writes it
(beam/contract/images.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from beam.contract.decoding import UNREADABLE, op_error_line, pixels_problem
from beam.contract.images import (MAX_IMAGE_PIXELS, MODEL_FORMATS, NOT_AN_IMAGE, ImageTooLarge, UnreadableFormat,
                                  inspect_image, model_image, needs_conversion, written_format)
from components.export.saved_model import DETECT_SIGNATURE, INPUT_NAME, ServingConfig
from components.export.model_files import check_model_dir

logger = logging.getLogger(__name__)


class BadImage(ValueError):
    """An input the model cannot take (not an image, corrupt, too large); the message is one line."""


class NotAnImage(BadImage):
    """Bytes that are no image, or one in a format the model does not take."""


class TooLarge(BadImage):
    """An image over the pixel limit every image reader shares (`MAX_IMAGE_PIXELS`), refused unread."""


def _refused(fmt: str) -> NotAnImage:
    return NotAnImage(f"{fmt} is not an image format the model takes ({MODEL_FORMATS})")


def _undecodable(reason: str) -> BadImage:
    return BadImage(f"the image cannot be decoded (truncated or corrupt: {reason})")


def model_image_bytes(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> bytes:
    """The bytes the model gets for one input image: checked, upright when its EXIF
    orientation says it is displayed turned, as PNG when its format is not JPEG or PNG
    (beam/contract/images.py: as the data step writes it). Raises `BadImage`; `TooLarge`,
    without decoding it, when it has more than `max_pixels` (the limit the data step, serve,
    predict and batch prediction share)."""
    if not data:
        raise NotAnImage("empty image")
    try:  # the header: the pixels are decoded below, by the decoder that will read them
        fmt, _, _, _, orientation = inspect_image(data, max_pixels, decode=False)
    except ImageTooLarge as err:
        raise TooLarge(f"the image is too large to decode ({err})") from None
    except UnreadableFormat as err:
        raise _refused(str(err)) from None
    except ValueError as err:
        reason = str(err).splitlines()[0] if str(err) else "unreadable"
        if reason == NOT_AN_IMAGE:
            raise NotAnImage(f"not an image ({MODEL_FORMATS})") from None
        raise _undecodable(reason) from None
    if written_format(fmt) is None:
        raise _refused(fmt)
    problem = pixels_problem(data, fmt, rewritten=orientation != 1 or needs_conversion(fmt))
    if problem is not None:
        kind, why = problem
        if kind == UNREADABLE:
            raise _undecodable(why.splitlines()[0] if why else "unreadable")
        raise BadImage(f"the model's decoder refuses the image (corrupt: {why})")  # Pillow reads it
    if orientation != 1 or needs_conversion(fmt):
        return model_image(data, turn=orientation != 1)
    return data


@dataclass
class Predictor:
    """A loaded SavedModel and its serving config."""

    config: ServingConfig
    _detect: object

    @classmethod
    def load(cls, model_dir: str, checked: bool = False) -> "Predictor":
        """The export in `model_dir`, after `check_model_dir` (its files, and a registered folder's
        checksums) unless the caller `checked` it already in this process (`serve`, before binding)."""
        if not checked:
            check_model_dir(model_dir)
        loaded = tf.saved_model.load(model_dir)
        return cls(ServingConfig.read(model_dir), loaded.signatures[DETECT_SIGNATURE])

    def threshold(self, requested: float | None) -> float:
        """The score threshold of a request: the one it asked for, else the export's."""
        return self.config.score_threshold if requested is None else requested

    def detect(self, images: list[bytes], score_threshold: float) -> dict[str, np.ndarray]:
        """One call of the model on images already passed through `model_image_bytes`: its
        outputs, one row per image, detections at or above `score_threshold` first, by score."""
        out = self._detect(**{INPUT_NAME: tf.constant(images), "score_threshold": tf.constant(score_threshold,
                                                                                               tf.float32)})
        return {k: v.numpy() for k, v in out.items()}

    def answer(self, out: dict[str, np.ndarray], row: int, score_threshold: float | None = None,
               max_detections: int | None = None) -> dict:
        """The prediction dict of image `row` of `detect`'s outputs: its detections scoring at
        least `score_threshold` (default: the export's), at most `max_detections`.

        `detect` ran at a threshold no higher: its rows come sorted by score, and the threshold
        is applied to the model's detections after non-maximum suppression
        (components/export/saved_model.py), so the rows at or above this threshold are those
        a call at this threshold returns, in the same order. This is what lets `serve` answer
        requests with different thresholds from one call of the model."""
        threshold = self.threshold(score_threshold)
        limit = self.config.max_detections if max_detections is None else max_detections
        scores = out["detection_scores"][row][:int(out["num_detections"][row])]
        n = min(int(np.count_nonzero(scores >= np.float32(threshold))), limit)
        return {
            "detection_boxes": np.round(out["detection_boxes"][row][:n].astype(float), 6).tolist(),
            "detection_scores": np.round(scores[:n].astype(float), 6).tolist(),
            "detection_classes": [int(c) for c in out["detection_classes"][row][:n]],
            "detection_class_names": [c.decode() for c in out["detection_class_names"][row][:n]],
            "num_detections": n,
        }

    def predict(self, images: list[bytes], score_threshold: float | None = None,
                max_detections: int | None = None) -> list[dict]:
        """One prediction dict per image (bytes already passed through `model_image_bytes`),
        lists cut to `num_detections`."""
        if not images:
            return []
        threshold = self.threshold(score_threshold)
        out = self.detect(images, threshold)
        return [self.answer(out, i, threshold, max_detections) for i in range(len(images))]

    def predict_each(self, images: list[bytes], score_threshold: float | None = None,
                     max_detections: int | None = None) -> list[dict | BadImage]:
        """`predict`, but an image the model cannot decode fails alone: when the call fails on
        one, each image is run by itself (as `serve`'s batcher answers each request alone) and
        that one's entry is a `BadImage` instead of a prediction dict."""
        try:
            return self.predict(images, score_threshold, max_detections)
        except tf.errors.InvalidArgumentError:
            if len(images) > 1:
                logger.warning("a call on %d images failed; running each alone", len(images))
        answers: list[dict | BadImage] = []
        for image in images:
            try:
                answers += self.predict([image], score_threshold, max_detections)
            except tf.errors.InvalidArgumentError as err:
                answers.append(BadImage(f"the model cannot decode the image ({op_error_line(err)})"))
        return answers
