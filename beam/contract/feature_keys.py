"""The tf.Example feature keys of the shards: the TF Object Detection API's keys.

Defined once here and imported by the trainer and the evaluator, so shards are
also readable by the TF OD API and TF Model Garden.
"""

ENCODED = "image/encoded"
FORMAT = "image/format"
HEIGHT = "image/height"
WIDTH = "image/width"
FILENAME = "image/filename"
SOURCE_ID = "image/source_id"
KEY_SHA256 = "image/key/sha256"
XMIN = "image/object/bbox/xmin"
YMIN = "image/object/bbox/ymin"
XMAX = "image/object/bbox/xmax"
YMAX = "image/object/bbox/ymax"
CLASS_TEXT = "image/object/class/text"
CLASS_LABEL = "image/object/class/label"
DIFFICULT = "image/object/difficult"

BOX_KEYS = (XMIN, YMIN, XMAX, YMAX)

# Not in the shards: the features files the data job computes its statistics on (beam/feature_batches.py)
# add each box's width and height as shares of the image, which TFDV's statistics and the run report read.
BOX_WIDTH = "detpipe/box_width"
BOX_HEIGHT = "detpipe/box_height"
