"""EXIF orientation: how a photo is displayed, and which frame its annotation was made in.

Phones store pixels as the sensor read them and record the rotation in the EXIF
`Orientation` tag (1-8). Annotation tools disagree: CVAT, Label Studio, Roboflow and every
browser show (and annotate) the displayed image; LabelImg annotates the stored pixels.
TensorFlow's decoders ignore EXIF, so a shard must hold pixels in the annotation's frame.

The rule (`apply_orientation`), by `--exif` mode:
- `ignore`: the stored pixels, always; `apply`: the displayed image, always.
- `auto` (default): the annotated size decides. It equals the displayed size and not the
  stored one: apply. It equals the stored size: keep the stored pixels. The sizes cannot
  tell (orientations 2-4 flip or turn by 180 degrees and keep the size; 5-8 on a square
  image; no size in the annotation): apply, as the tools that show photos the way a person
  sees them do.

Applied orientations are written upright and without EXIF (beam/contract/images.py's
`model_image`: a JPEG is re-encoded at quality 95, a PNG stays lossless). `upright` is the one
function that turns a photo the way a person sees it, for everything that reads photos.

Example:
    >>> displayed_size(200, 100, 6), apply_orientation(6, (200, 100), (100, 200), "auto")
    ((100, 200), True)
    >>> apply_orientation(6, (200, 100), (200, 100), "auto"), apply_orientation(3, (200, 100), None, "auto")
    (False, True)
"""

from __future__ import annotations

from PIL import Image, ImageOps

ORIENTATION_TAG = 0x0112
EXIF_MODES = ("auto", "apply", "ignore")
_SWAPS_AXES = {5, 6, 7, 8}  # transpose, rotate 270, transverse, rotate 90


def orientation_of(image: Image.Image) -> int:
    """The EXIF orientation of an opened image: 1 (as stored) when absent or invalid."""
    value = image.getexif().get(ORIENTATION_TAG, 1)
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def displayed_size(width: int, height: int, orientation: int) -> tuple[int, int]:
    """(width, height) as displayed: swapped for the orientations that turn by 90 degrees."""
    return (height, width) if orientation in _SWAPS_AXES else (width, height)


def check_exif_mode(mode: str) -> str:
    if mode not in EXIF_MODES:
        raise ValueError(f"--exif must be one of {', '.join(EXIF_MODES)}, got {mode!r}")
    return mode


def apply_orientation(orientation: int, stored: tuple[int, int], annotated: tuple[int, int] | None,
                      mode: str = "auto") -> bool:
    """Whether the shard gets the displayed image (True) or the stored pixels (False)."""
    check_exif_mode(mode)
    if orientation == 1 or mode == "ignore":
        return False
    if mode == "apply":
        return True
    displayed = displayed_size(*stored, orientation)
    if annotated is None or displayed == stored:
        return True  # the sizes cannot tell: as the image is displayed
    return annotated == displayed


def upright(image: Image.Image) -> Image.Image:
    """The image as displayed (EXIF orientation applied, the tag removed)."""
    return ImageOps.exif_transpose(image)

