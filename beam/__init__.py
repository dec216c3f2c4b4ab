"""detpipe."""

from components import tf_import

tf_import.install()  # before anything here imports TensorFlow (components/tf_import.py says why)
