"""Which image formats go into a shard (and into the served model), and the bytes written.

- JPEG and PNG are written as they are: TensorFlow decodes both, and they are the two
  `image/format` values of the TF OD API. MPO, the multi-picture JPEG that many cameras and
  phones write (a JPEG followed by more pictures, e.g. a depth map; Pillow names it "MPO"),
  is a JPEG to every decoder: written as it is, as `jpeg`.
- BMP, GIF, TIFF, WEBP and AVIF, which labelling tools accept but not every TensorFlow decoder
  and not the TF OD API, are converted once to PNG (lossless; an animation's first frame,
  which is what TensorFlow's `decode_image(expand_animations=False)` would take).
- Any other format is refused (`unsupported_format` in the data job, a 400 from `serve`),
  named when it is one Pillow cannot read at all but a phone writes (HEIF/HEIC).

`model_image` is the one re-encoding: the data job (beam/example_codec.py) and the
predictor (components/export/predictor.py) both call it, so a converted or turned photo
reaches the model as the same pixels in training and in serving.

Example:
    >>> written_format("MPO"), written_format("WEBP"), written_format("ICO")
    ('jpeg', 'png', None)
    >>> import io; from PIL import Image
    >>> bmp = io.BytesIO(); Image.new("RGB", (3, 2), (9, 8, 7)).save(bmp, "BMP")
    >>> png = model_image(bmp.getvalue(), turn=False)
    >>> Image.open(io.BytesIO(png)).format, Image.open(io.BytesIO(png)).getpixel((2, 1))
    ('PNG', (9, 8, 7))
"""

from __future__ import annotations

import io

from PIL import Image, UnidentifiedImageError

from beam.contract.exif import orientation_of, upright

# The file suffixes of the image formats the data step takes (below), for finding an image
# whose annotation names it without one and for telling an images folder.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".avif", ".jfif", ".jpe")
# The largest image the data step writes and `serve` decodes, in pixels (width x height):
# beyond, a reject (`image_too_large`) or a 413, said from the header before any pixel is decoded.
MAX_IMAGE_PIXELS = 50_000_000
# The largest image file any reader takes, in bytes: a photo of MAX_IMAGE_PIXELS stored
# uncompressed at 4 bytes a pixel is 200 MB; twice that leaves room for 16-bit TIFFs. A larger
# file is refused after reading one byte past the limit (`read_image_file`), never held whole.
MAX_IMAGE_BYTES = 400_000_000
# What `inspect_image` says of bytes in no image format Pillow knows (a text file named .jpg).
NOT_AN_IMAGE = "not an image file (no image format Pillow knows)"

# Pillow's format name -> `image/format` of the bytes written as they are.
KEPT_FORMATS = {"JPEG": "jpeg", "MPO": "jpeg", "PNG": "png"}
# Pillow's format names written as PNG.
CONVERTED_FORMATS = ("BMP", "GIF", "TIFF", "WEBP", "AVIF")
# The same lists in words, for messages: "... BMP, GIF, TIFF, WEBP and AVIF (written as PNG)".
_CONVERTED_BUT_LAST = ", ".join(CONVERTED_FORMATS[:-1])
ACCEPTED = f"JPEG and PNG (as they are), {_CONVERTED_BUT_LAST} and {CONVERTED_FORMATS[-1]} (written as PNG)"
MODEL_FORMATS = f"JPEG, PNG, {_CONVERTED_BUT_LAST} or {CONVERTED_FORMATS[-1]}"  # what `serve` and `predict` take
# The brands of HEIF files (iPhone photos, `.heic`), which Pillow cannot open: their ISO
# media header names them, so the reject can say what the file is instead of "not an image".
_HEIF_BRANDS = (b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1")
JPEG_QUALITY = 95  # a turned JPEG: Pillow has no lossless JPEG rotation; PNG would be several times larger
# Pillow's modes that PNG stores as they are (I as 16 bits); any other (CMYK, YCbCr, LAB, F,
# ...) is converted to RGB (RGBA with transparency) first, as training would read it.
_PNG_MODES = ("1", "L", "LA", "P", "RGB", "RGBA", "I", "I;16")


def written_format(pil_format: str) -> str | None:
    """The `image/format` a shard gets for an image of this Pillow format; None: refused."""
    if pil_format in KEPT_FORMATS:
        return KEPT_FORMATS[pil_format]
    return "png" if pil_format in CONVERTED_FORMATS else None


def unreadable_format(data: bytes) -> str | None:
    """The name of an image format Pillow cannot open but that users meet (HEIF), else None.

    >>> unreadable_format(b"\\x00\\x00\\x00\\x18ftypheic\\x00\\x00\\x00\\x00"), unreadable_format(b"hello")
    ('HEIF', None)
    """
    return "HEIF" if data[4:8] == b"ftyp" and data[8:12] in _HEIF_BRANDS else None


def needs_conversion(pil_format: str) -> bool:
    return pil_format in CONVERTED_FORMATS


def model_image(data: bytes, turn: bool) -> bytes:
    """Encoded image bytes -> the bytes a shard holds and the model gets, for an image that
    is not passed on as it is: upright (EXIF orientation applied, the tag removed) when
    `turn`, a JPEG re-encoded as JPEG, every other format as PNG. Deterministic: the same
    input gives the same bytes."""
    with Image.open(io.BytesIO(data)) as image:
        fmt = image.format
        picture = upright(image) if turn else image.copy()
    out = io.BytesIO()
    if KEPT_FORMATS.get(fmt) == "jpeg":
        picture.save(out, format="JPEG", quality=JPEG_QUALITY)
    else:
        if picture.mode not in _PNG_MODES:
            picture = picture.convert("RGBA" if picture.has_transparency_data else "RGB")
        picture.save(out, format="PNG")
    return out.getvalue()


class FileTooLarge(ValueError):
    """An image file over `MAX_IMAGE_BYTES`."""


def read_image_file(handle, limit: int | None = None) -> bytes:
    """The bytes of an open image file (local or Beam's), at most `limit` (`MAX_IMAGE_BYTES`):
    raises `FileTooLarge` without reading further.

    >>> import io; read_image_file(io.BytesIO(b"12345"), limit=5)
    b'12345'
    >>> read_image_file(io.BytesIO(b"123456"), limit=5)
    Traceback (most recent call last):
    ...
    beam.contract.images.FileTooLarge: the file is over the limit of 5 bytes
    """
    limit = MAX_IMAGE_BYTES if limit is None else limit
    data = handle.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(f"the file is over the limit of {limit:,} bytes")
    return data


class ImageTooLarge(ValueError):
    """An image over Pillow's decompression-bomb limit (about 179 M pixels), refused unread."""


class UnreadableFormat(ValueError):
    """An image in a format Pillow cannot open (HEIF); the message is the format's name."""


def inspect_image(data: bytes, max_pixels: int | None = None, decode: bool = True) -> tuple[str, int, int, str, int]:
    """(PIL format, stored width, stored height, mode, EXIF orientation) after decoding the
    whole image, a JPEG at 1/8 scale: libjpeg's DCT-domain scaling still entropy-decodes
    every coefficient (so a truncated or corrupt stream fails as in a full decode) but
    skips most of the inverse DCT and colour conversion, which nothing here needs. With
    `decode` False, from the header alone (the caller decodes the pixels some other way).

    Raises `ValueError` for data Pillow cannot decode (corrupt or truncated), `ImageTooLarge`
    for an image too large to decode at all or, given `max_pixels`, over it (said from the
    header, before any pixel is decoded: a small file can hold a huge picture), `UnreadableFormat`
    for an image in a format Pillow cannot open.
    """
    try:
        with Image.open(io.BytesIO(data)) as image:
            fmt, (width, height), mode = image.format, image.size, image.mode
            orientation = orientation_of(image)
            if max_pixels is not None and width * height > max_pixels:
                raise ImageTooLarge(f"it is {width:,} x {height:,} pixels, over the limit of {max_pixels:,}")
            if decode:
                if fmt in ("JPEG", "MPO"):  # MPO: a JPEG with more pictures after it (above)
                    image.draft(mode, (max(1, width // 8), max(1, height // 8)))
                image.load()  # decodes the whole stream: catches truncated files
    except UnidentifiedImageError:  # Pillow's message names the BytesIO object and its address
        known = unreadable_format(data)
        raise (UnreadableFormat(known) if known else ValueError(NOT_AN_IMAGE)) from None
    except Image.DecompressionBombError as err:  # said before any pixel is decoded
        raise ImageTooLarge(str(err).split(", could be")[0]) from None
    except (OSError, SyntaxError) as err:
        raise ValueError(str(err) or type(err).__name__) from err
    return fmt or "unknown", width, height, mode, orientation
