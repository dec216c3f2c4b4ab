"""Detections drawn on a copy of an image, for people to look at (`detpipe predict --output`).

Each class has its own colour (matplotlib's qualitative tab10/tab20 palettes, by class id, so
a class keeps its colour from image to image), and each label is drawn on a filled tag in
that colour with a font scaled to the image, so it stays readable on a dense or a large
photo. Pillow draws; only the sizing and the tag layout are ours.
"""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont


def class_colour(class_id: int, num_classes: int) -> tuple[int, int, int]:
    """A distinct colour per class id (1-based): tab10 up to 10 classes, tab20 beyond."""
    from matplotlib import colormaps

    palette = colormaps["tab10" if num_classes <= 10 else "tab20"]
    r, g, b, _ = palette((class_id - 1) % palette.N)
    return round(r * 255), round(g * 255), round(b * 255)


def _text_colour(fill: tuple[int, int, int]) -> tuple[int, int, int]:
    """Black on light tags, white on dark ones (relative luminance)."""
    luminance = 0.2126 * fill[0] + 0.7152 * fill[1] + 0.0722 * fill[2]
    return (0, 0, 0) if luminance > 150 else (255, 255, 255)


def draw_detections(image_bytes: bytes, prediction: dict, path: Path, num_classes: int) -> None:
    """A copy of the (upright) image with each detection's box and a "class score" tag, JPEG."""
    image = Image.open(io.BytesIO(image_bytes)).convert("RGB")
    draw = ImageDraw.Draw(image)
    width, height = image.size
    side = min(width, height)
    line = max(2, round(side / 250))
    font = ImageFont.load_default(size=max(11, round(side / 45)))
    # Lowest scores first, so the most confident boxes and tags end up on top.
    rows = sorted(zip(prediction["detection_boxes"], prediction["detection_classes"],
                      prediction["detection_class_names"], prediction["detection_scores"]), key=lambda r: r[3])
    for (ymin, xmin, ymax, xmax), class_id, name, score in rows:
        colour = class_colour(int(class_id), num_classes)
        box = (xmin * width, ymin * height, xmax * width, ymax * height)
        draw.rectangle(box, outline=colour, width=line)
        text = f"{name} {score:.2f}"
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        tag_w, tag_h = right - left + 2 * line, bottom - top + 2 * line
        x = min(max(0, box[0]), max(0, width - tag_w))
        y = box[1] - tag_h if box[1] - tag_h >= 0 else box[1]  # above the box, else inside its top
        draw.rectangle((x, y, x + tag_w, y + tag_h), fill=colour)
        draw.text((x + line - left, y + line - top), text, fill=_text_colour(colour), font=font)
    image.save(path, quality=92)
