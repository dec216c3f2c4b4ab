"""The names of the files `detpipe export` writes, in a module without TensorFlow: `serve`
looks for them before it loads TensorFlow (components/export/model_files.py)."""

from beam.contract.manifest import LABEL_MAP_FILE as DATASET_LABEL_MAP_FILE

SAVED_MODEL_FILE = "saved_model.pb"  # TensorFlow's name for the graph in a SavedModel folder
SERVING_CONFIG_FILE = "serving_config.json"
LABEL_MAP_FILE = DATASET_LABEL_MAP_FILE  # the class names beside the SavedModel, as beside the shards
