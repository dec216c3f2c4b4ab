"""The names of the files `detpipe export` writes, and the default score threshold of its
serving config, in a module without TensorFlow: `serve` looks for them before it loads
TensorFlow (components/export/model_files.py)."""

from beam.contract.manifest import LABEL_MAP_FILE as DATASET_LABEL_MAP_FILE

SAVED_MODEL_FILE = "saved_model.pb"  # TensorFlow's name for the graph in a SavedModel folder
SERVING_CONFIG_FILE = "serving_config.json"
LABEL_MAP_FILE = DATASET_LABEL_MAP_FILE  # the class names beside the SavedModel, as beside the shards
# The exported model's score threshold when no evaluation chose one (or evaluation had nothing
# to choose from: no detections, no truth boxes).
DEFAULT_SCORE_THRESHOLD = 0.3
EXPORT_BATCH = 8  # images per detector call inside the SavedModel (its serving config's model_batch)
