"""The label review of the train split, out of sample (`detpipe review --review-folds K`): the
train records split into K folds; for each fold a model trained from scratch on the other K-1
folds, with the options of the model under review, predicts the fold; the review scores every
train label against the detections of the one model that did not see it.

Costly, so off by default: K trainings on (K-1)/K of the train split each, about K-1 times the
training of the model under review, plus a prediction pass over the train split. The val split's
review (review.py) costs no training at all.

Fold of a record: the sha256 of its serialized bytes, modulo K (deterministic, independent of
the shard layout). Written by hand: the folds are a few lines over TFRecords, and no library
here splits TFRecord shards.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from dataclasses import replace
from pathlib import Path

from beam.contract.manifest import LABEL_MAP_FILES
from beam.contract.shard_names import shard_name
from components.detector.coco_metrics import ImageDetections, ImageTruth

logger = logging.getLogger(__name__)

FOLD_DIR = "fold-{k}"  # under the review's work folder: fold k's shards and its model
MIN_FOLDS = 2


def fold_of(serialized: bytes, folds: int) -> int:
    """The fold of a record: its sha256 modulo `folds`.

    >>> fold_of(b"a record", 5), fold_of(b"a record", 5) == fold_of(b"a record", 5)
    (1, True)
    """
    return int.from_bytes(hashlib.sha256(serialized).digest()[:8], "big") % folds


def write_fold(data_dir: str, folds: int, k: int, folder: str | Path) -> int:
    """Fold k's shard folder: its `val` split is the train records of fold k, its `train` split
    every other train record; the label map is the data's. Returns fold k's record count;
    raises when fold k or the rest would be empty (fewer train records than folds). One fold
    at a time, so the disk holds one copy of the train split, not K."""
    import tensorflow as tf

    from components.detector.records import compression_type, read_records, shard_files

    files = shard_files(data_dir, "train")
    compression = compression_type(files)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name in LABEL_MAP_FILES:
        if (Path(data_dir) / name).is_file():
            shutil.copyfile(Path(data_dir) / name, folder / name)
    options = tf.io.TFRecordOptions(compression_type=compression)
    counts = {"train": 0, "val": 0}
    writers = {split: tf.io.TFRecordWriter(str(folder / shard_name(split, 0, 1, gzip=bool(compression))), options)
               for split in counts}
    for record in read_records(files, deterministic=True):
        raw = record.numpy()
        split = "val" if fold_of(raw, folds) == k else "train"
        writers[split].write(raw)
        counts[split] += 1
    for writer in writers.values():
        writer.close()
    if not counts["train"] or not counts["val"]:
        raise ValueError(f"{sum(counts.values())} train records leave fold {k + 1} of {folds} with "
                         f"{counts['val']} to review and {counts['train']} to train on: use fewer --review-folds")
    return counts["val"]


def fold_train_config(model_dir: str, data_dir: str, output_dir: str, epochs: int | None = None):
    """The TrainConfig of a fold's model: the options the model under review was trained with
    (its train_config.json), on the fold's data, from scratch (a warm start from a model that
    saw the fold's labels would not be out of sample)."""
    from components.detector.artifacts import TrainConfigFile
    from components.train.config import TrainConfig

    config = TrainConfig.from_dict(TrainConfigFile.read(model_dir).train)
    return replace(config, data_dir=data_dir, output_dir=output_dir, init_from=None, init_name="",
                   init_note="out-of-sample fold of a label review", fine_tune_epochs=0,
                   epochs=epochs or config.epochs, cache="")


def predict_folds(model_dir: str, data_dir: str, folds: int, work_dir: str | Path, epochs: int | None = None,
                  ) -> tuple[list[ImageTruth], list[ImageDetections], list[bytes]]:
    """Every train record's labels and the detections of the fold model that did not train on
    it, with the encoded images (for the page), fold by fold; image ids renumbered 1..N. Each
    fold's shards and model are removed once it has predicted."""
    from components.detector.artifacts import load_trained
    from components.detector.split_prediction import predict_split
    from components.evaluate.evaluator import val_images
    from components.train.trainer import train_detector

    if folds < MIN_FOLDS:
        raise ValueError(f"--review-folds must be at least {MIN_FOLDS} (or 0: the val split only), got {folds}")
    truths: list[ImageTruth] = []
    detections: list[ImageDetections] = []
    images: list[bytes] = []
    for k in range(folds):
        folder = Path(work_dir) / FOLD_DIR.format(k=k + 1)
        held_out = write_fold(data_dir, folds, k, folder)
        config = fold_train_config(model_dir, str(folder), str(folder / "model"), epochs)
        logger.info("review fold %d of %d: %d train records held out, a model trained on the others (%d epochs)",
                    k + 1, folds, held_out, config.epochs)
        train_detector(config)
        model, trained = load_trained(str(folder / "model"))
        fold_truths, fold_detections = predict_split(model, str(folder), trained.image_size, tiling=trained.tiling)
        encoded, _ = val_images(str(folder))
        for truth, found in zip(fold_truths, fold_detections):
            image_id = len(truths) + 1
            truths.append(replace(truth, image_id=image_id))
            detections.append(replace(found, image_id=image_id))
        images.extend(encoded)
        shutil.rmtree(folder)
    return truths, detections, images


def fold_cost(model_dir: str, folds: int, epochs: int | None = None) -> str:
    """What `folds` fold models cost, from the model's own training: (K-1) x its train images x
    the epochs, at the images/s it trained at (a GPU's rate where it trained on one)."""
    from components.detector.artifacts import TrainConfigFile

    record = TrainConfigFile.read(model_dir)
    epochs = epochs or record.train["epochs"]
    num_train = record.result["num_train"]
    images = (folds - 1) * num_train * epochs
    rate = record.images_per_second
    minutes = f"about {images / rate / 60:.0f} min at the {rate:.1f} images/s it trained at" if rate > 0 else \
        "its rate unknown"
    return (f"{folds} models of {epochs} epochs, each on {folds - 1}/{folds} of the {num_train} train images: "
            f"{images} images trained, {minutes}")
