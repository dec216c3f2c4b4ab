"""The limits of `detpipe serve`, declared once: read by the server and by `serve --help`
(this module imports no TensorFlow, so the help stays quick)."""

from beam.contract.images import MAX_IMAGE_PIXELS  # an image is refused unread above it, as the data step refuses it

MAX_BODY_BYTES = 1_500_000  # Vertex AI's limit on an online prediction request
DEFAULT_BODY_TIMEOUT_S = 30.0  # the longest a body may take to arrive
DEFAULT_MAX_INSTANCES = 32  # images in one request
