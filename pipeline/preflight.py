"""Checks of what a folder or file holds, made before TensorFlow or Beam are imported.

A mistake such as `--annotations` pointing at the images, or `--data` at a folder that is
not `detpipe data build`'s output, should be answered in a fraction of a second, not after
a minute of imports. These look at names on the local file system only (a gs:// URI is
checked later, by what reads it) and return the problem as one line that starts with the
path (the caller names the option), or None when all is well.
Each message says what was expected and, where the folder holds something recognisable,
what it holds instead.
"""

from __future__ import annotations

import os
from collections import Counter

from beam.contract.images import IMAGE_SUFFIXES
from beam.contract.manifest import LABEL_MAP_FILE
from beam.contract.shard_names import SHARD_SUFFIX, SHARD_SUFFIXES
from beam.split import given_split_conflict
from components.detector.artifacts import CONFIG_FILE, MODEL_FILE
from components.export.export_files import SAVED_MODEL_FILE

# Names looked at in a folder before deciding what it holds: enough to tell, fast on huge folders.
_LOOK_AT = 2000


def _local(path: str) -> bool:
    return "://" not in path


def _names(folder: str) -> list[str]:
    names = []
    with os.scandir(folder) as entries:
        for entry in entries:
            names.append(entry.name)
            if len(names) >= _LOOK_AT:
                break
    return names


def _suffix(name: str) -> str:
    lower = name.lower()
    return SHARD_SUFFIXES[1] if lower.endswith(SHARD_SUFFIXES[1]) else os.path.splitext(lower)[1]


def describe(folder: str) -> str:
    """What a folder holds, in a few words ("12 .jpg files and 3 folders"), for messages."""
    names = _names(folder)
    if not names:
        return "nothing (it is empty)"
    kinds = Counter("folders" if os.path.isdir(os.path.join(folder, n)) else (_suffix(n) or "no-suffix") + " files"
                    for n in names)
    more = "at least " if len(names) >= _LOOK_AT else ""
    return more + ", ".join(f"{count} {kind}" for kind, count in kinds.most_common(3))


def _has(folder: str, suffixes: tuple[str, ...]) -> bool:
    return any(_suffix(n) in suffixes for n in _names(folder))


def images_problem(images: str) -> str | None:
    """`--images` must be a folder with image files in it, or with folders (a COCO file may
    name images in subfolders: those are checked by the job)."""
    if not _local(images) or not os.path.isdir(images):
        return None
    if _has(images, IMAGE_SUFFIXES) or any(os.path.isdir(os.path.join(images, n)) for n in _names(images)):
        return None
    hint = " (these look like VOC annotations: are --images and --annotations swapped?)" if _has(images, (".xml",)) \
        else ""
    return f"{images} holds no image files ({', '.join(IMAGE_SUFFIXES[:3])}, ...): it has {describe(images)}{hint}"


def annotations_problem(annotations: str, data_format: str) -> str | None:
    """`--annotations` as `--format` reads it: VOC a folder of *.xml, COCO a .json file, CSV a .csv file."""
    if not _local(annotations) or not os.path.exists(annotations):
        return None
    folder = os.path.isdir(annotations)
    if data_format == "voc":
        if not folder:
            guess = {".json": "coco", ".csv": "csv"}.get(_suffix(annotations))
            return (f"{annotations} is a file; --format voc reads a folder of *.xml files"
                    + (f" (for this file, --format {guess})" if guess else ""))
        if _has(annotations, (".xml",)):
            return None
        hint = " (these look like the images: are --images and --annotations swapped?)" \
            if _has(annotations, IMAGE_SUFFIXES) else ""
        return f"{annotations} holds no *.xml files for --format voc: it has {describe(annotations)}{hint}"
    wanted = {"coco": ".json", "csv": ".csv"}.get(data_format)
    if wanted is None:
        return None
    if folder:
        hint = " (a folder of *.xml is --format voc)" if _has(annotations, (".xml",)) else ""
        return f"{annotations} is a folder; --format {data_format} reads one {wanted} file{hint}"
    if _suffix(annotations) != wanted:
        return f"{annotations} is not a {wanted} file, which --format {data_format} reads"
    return None


def given_split_problem(data_format: str, val_annotations: str | None, val_images: str | None,
                        split_file: str | None) -> str | None:
    """The val split's own annotations, checked as `--annotations` is; --val-images without
    them, or a split file beside them, is a conflict."""
    conflict = given_split_conflict(split_file, val_annotations, val_images)
    if conflict or not val_annotations:
        return conflict
    problem = annotations_problem(val_annotations, data_format)
    return f"--val-annotations {problem}" if problem else None


def shards_problem(data: str) -> str | None:
    """A folder written by `detpipe data build`: label_map.json and train-*/val-* shards."""
    if not _local(data) or not os.path.isdir(data):
        return None
    names = _names(data)
    shards = [n for n in names if _suffix(n) in SHARD_SUFFIXES and n.startswith(("train-", "val-"))]
    if LABEL_MAP_FILE in names and shards:
        return None
    what = f"no {LABEL_MAP_FILE}" if shards else f"no train-*{SHARD_SUFFIX} shards"
    hint = ""
    if MODEL_FILE in names or SAVED_MODEL_FILE in names:
        hint = " (it looks like a trained model)"
    elif _has(data, IMAGE_SUFFIXES) or _has(data, (".xml",)) or "annotations" in names or "images" in names:
        hint = " (it looks like a raw dataset: convert it first with `detpipe data build --output DIR`)"
    return (f"{data} is not the output of `detpipe data build` ({what}): it has {describe(data)}{hint}")


def trained_model_problem(model: str) -> str | None:
    """A folder written by `detpipe train`: model.keras and train_config.json."""
    if not _local(model) or not os.path.isdir(model):
        return None
    names = _names(model)
    if MODEL_FILE in names and CONFIG_FILE in names:
        return None
    hint = " (it is an exported SavedModel: pass the folder `detpipe train` wrote)" if SAVED_MODEL_FILE in names \
        else ""
    return f"{model} is not the output of `detpipe train` (no {MODEL_FILE} + {CONFIG_FILE}): it has " \
           f"{describe(model)}{hint}"


def saved_model_problem(model: str) -> str | None:
    """A folder written by `detpipe export` (or a pipeline's export step): saved_model.pb."""
    if not _local(model) or not os.path.isdir(model):
        return None
    names = _names(model)
    if SAVED_MODEL_FILE in names:
        return None
    hint = " (it is a training output: export it first with `detpipe export`)" if MODEL_FILE in names else ""
    if "saved_model" in names and os.path.isfile(os.path.join(model, "saved_model", SAVED_MODEL_FILE)):
        hint = f" (did you mean {os.path.join(model, 'saved_model')}?)"
    return f"{model} is not an exported model (no {SAVED_MODEL_FILE}): it has {describe(model)}{hint}"
