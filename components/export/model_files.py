"""Is there an exported model here? Answered before TensorFlow is imported (~12 s on a
small machine), so `detpipe serve --model WRONG` fails at once; a gs:// or other remote
location is looked at through TensorFlow's file systems."""

from __future__ import annotations

import os

from components.export.export_files import SAVED_MODEL_FILE, SERVING_CONFIG_FILE
from components.model_registry.checksums import verify_folder


class ModelNotFound(FileNotFoundError):
    """No exported SavedModel at the given location."""


def check_model_dir(model_dir: str) -> None:
    """Raise `ModelNotFound` unless `model_dir` holds an export of `detpipe export`."""
    root = model_dir.rstrip("/")
    if "://" in root:
        import tensorflow as tf

        exists = tf.io.gfile.exists
    else:
        exists = os.path.exists
    for name in (SAVED_MODEL_FILE, SERVING_CONFIG_FILE):
        if not exists(f"{root}/{name}"):
            raise ModelNotFound(f"{model_dir} holds no {name}: pass the output of `detpipe export` "
                                "(or the export step of a pipeline run)")
    verify_folder(root)  # a folder the registry wrote (a version, the champion): the files it registered
