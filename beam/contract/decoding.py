"""How a shard's image bytes become pixels: TensorFlow's decoders, the one definition that
training, evaluation, the exported model and the data step's own check all run.

Pillow and TensorFlow's libjpeg do not agree on every file: a JPEG with a damaged entropy-coded
segment (one byte of `raccoon-1.jpg` set to 0xFF) loads in Pillow, which fills what it cannot
read, and is refused by `tf.io.decode_jpeg` ("jpeg::Uncompress failed"). So the data step
decodes each image it writes as JPEG or PNG with these ops too (`decode_problem`), and rejects
what fails (`tensorflow_cannot_decode`, beam/contract/rejects.py) instead of a training run
finding it hours in.

TensorFlow is imported here at the top: only the modules that decode import this one.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from beam.contract.images import inspect_image, needs_conversion


def decode_rgb(encoded: tf.Tensor) -> tf.Tensor:
    """JPEG/PNG bytes → uint8 RGB (greyscale, CMYK, palette and alpha become 3 channels).
    TensorFlow ignores EXIF: the data step wrote photos in their annotation's frame."""
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    return image


# libjpeg's scaled decodes (1/2, 1/4, 1/8): in the DCT domain, so most of the inverse DCT,
# upsampling and colour conversion is skipped (a 4000x3000 photo: ~3x faster at 1/4).
JPEG_SCALES = (2, 4, 8)


def decode_at_least(encoded: tf.Tensor, shorter_side: tf.Tensor | float) -> tf.Tensor:
    """JPEG/PNG bytes → uint8 RGB as `decode_rgb`, but a JPEG whose shorter side is at least 2,
    4 or 8 times `shorter_side` decodes at that scale (the largest that keeps `shorter_side`
    pixels): what a model resize to `shorter_side` keeps of it, at a fraction of the work, and
    smoother than a bilinear resize of the whole photo. Other formats decode whole. Training,
    evaluation and the exported model all decode this way, so they see the same pixels."""
    def scale_index() -> tf.Tensor:  # how many of JPEG_SCALES keep `shorter_side`
        short = tf.cast(tf.reduce_min(tf.image.extract_jpeg_shape(encoded)[:2]), tf.float32)
        return tf.add_n([tf.cast(short >= scale * tf.cast(shorter_side, tf.float32), tf.int32)
                         for scale in JPEG_SCALES])

    def at_scale(scale: int):
        return lambda: tf.ensure_shape(tf.io.decode_jpeg(encoded, channels=3, ratio=scale), [None, None, 3])

    index = tf.cond(tf.io.is_jpeg(encoded), scale_index, lambda: tf.constant(0))
    return tf.switch_case(index, [lambda: decode_rgb(encoded), *(at_scale(scale) for scale in JPEG_SCALES)])


def decode_crop(encoded: tf.Tensor, crop_of: Callable[[tf.Tensor], tuple]) -> tuple[tf.Tensor, Any]:
    """Decode one region of an image: `crop_of(shape)` (the image's (height, width), float32)
    returns (corner, extent, extra): the region's top-left and size in whole pixels (float32)
    and anything else it computed. A JPEG decodes only that region (libjpeg's cropped decode:
    a tile of a large photo costs a fraction of the whole), other formats decode whole and are
    sliced. Returns the region (uint8 RGB) and `extra`."""
    def jpeg():
        corner, extent, extra = crop_of(tf.cast(tf.image.extract_jpeg_shape(encoded)[:2], tf.float32))
        region = tf.io.decode_and_crop_jpeg(encoded, tf.cast(tf.concat([corner, extent], 0), tf.int32), channels=3)
        return tf.ensure_shape(region, [None, None, 3]), extra

    def whole():
        image = decode_rgb(encoded)
        corner, extent, extra = crop_of(tf.cast(tf.shape(image)[:2], tf.float32))
        return tf.slice(image, tf.concat([tf.cast(corner, tf.int32), [0]], 0),
                        tf.concat([tf.cast(extent, tf.int32), [-1]], 0)), extra

    return tf.cond(tf.io.is_jpeg(encoded), jpeg, whole)


def decode_check(encoded: tf.Tensor) -> tf.Tensor:
    """Decode as the readers decode, as cheaply as that can be, and return the pixel count (in
    a graph or eagerly): a JPEG at 1/8 scale (`decode_at_least`'s smallest), which still
    entropy-decodes every coefficient, so it fails exactly where a full decode, a scaled one or
    the crop decode of tiling fails (300 damaged raccoon photos: the same verdict at 1/1 and
    1/8); any other format whole (`decode_rgb`). Raises TensorFlow's decoder error."""
    return tf.cond(tf.io.is_jpeg(encoded),
                   lambda: tf.size(tf.io.decode_jpeg(encoded, channels=3, ratio=JPEG_SCALES[-1])),
                   lambda: tf.size(decode_rgb(encoded)))


# What `tf.io.is_jpeg` looks for: the SOI marker and the start of the next marker.
_JPEG_START = b"\xff\xd8\xff"


def decode_problem(data: bytes) -> str | None:
    """Why TensorFlow's decoders refuse these image bytes (`decode_check`'s decode, run eagerly),
    in one line, or None when they decode. The JPEG-or-not branch is taken in Python on
    `tf.io.is_jpeg`'s own test: an eager `tf.cond` cost ~170 us an image here, more than the
    ~95 us of the decode of a 128 px JPEG itself (the data step runs this on every image).
    libjpeg's own warnings still go to stderr as it prints them."""
    try:
        if data[:3] == _JPEG_START:
            tf.io.decode_jpeg(data, channels=3, ratio=JPEG_SCALES[-1])
        else:
            decode_rgb(data)
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as err:
        return op_error_line(err)
    return None


# What `pixels_problem` found: Pillow cannot decode the image either (truncated, corrupt), or
# only TensorFlow refuses it (a damaged JPEG Pillow fills in).
UNREADABLE, REFUSED_BY_TENSORFLOW = "unreadable", "refused_by_tensorflow"


def pixels_problem(data: bytes, pil_format: str, rewritten: bool) -> tuple[str, str] | None:
    """(UNREADABLE or REFUSED_BY_TENSORFLOW, why in one line) for an image whose header read,
    else None. The pixels are decoded by what will read them, once each: TensorFlow's decoders
    for a JPEG or PNG (the bytes the trainer, the evaluator and the exported model decode, as
    they are or, turned upright, made from them) and Pillow where the image is rewritten
    (`rewritten`: turned upright or converted to PNG by `images.model_image`) or TensorFlow
    refused it, to tell the two kinds apart. The data step and the predictor both check so."""
    refused = None if needs_conversion(pil_format) else decode_problem(data)
    if refused or rewritten:
        try:
            inspect_image(data)
        except ValueError as err:
            return UNREADABLE, str(err)
    return (REFUSED_BY_TENSORFLOW, refused) if refused else None


def op_error_line(err: tf.errors.OpError) -> str:
    """A TensorFlow op's error in one line, without the graph's and function's names: a
    decoder's "jpeg::Uncompress failed. Invalid JPEG data or crop window.", a reader's
    "corrupted record at 1143430"."""
    message = str(err.message).strip().splitlines()[0] if err.message else type(err).__name__
    # "{{function_node __wrapped__DecodeJpeg_device_/job:...}} jpeg::Uncompress failed. ... [Op:DecodeJpeg]"
    message = message.rsplit("}}", 1)[-1].split(" [Op:")[0].strip()
    return message[:200] or type(err).__name__
