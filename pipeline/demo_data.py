"""A deterministic synthetic detection dataset in Pascal VOC layout.

Shapes of three classes (circle, square, triangle) with varied size, colour and
overlap, on gradient backgrounds with clutter (lines, specks and small blobs too
small to be objects). It is written as `images/*.jpg` + `annotations/*.xml`, so it
goes through exactly the importer that real VOC data goes through.

Example:
    >>> from pathlib import Path
    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp())
    >>> summary = write_demo_dataset(out, num_train=4, num_val=2, seed=1)
    >>> summary.num_images, len(list((out / "annotations").glob("*.xml")))
    (6, 6)
"""

from __future__ import annotations

import io
import json
import logging
import random
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

logger = logging.getLogger(__name__)

CLASSES = ("circle", "square", "triangle")
IMAGE_SIZE = 128
MIN_OBJECT, MAX_OBJECT = 26, 58
OBJECTS = (1, 3)  # objects per image, min and max
MAX_OVERLAP_IOU = 0.25


@dataclass(frozen=True)
class DemoObject:
    """One annotated shape; box in pixel coordinates (xmin, ymin, xmax, ymax)."""

    name: str
    box: tuple[int, int, int, int]


@dataclass(frozen=True)
class DemoSummary:
    num_images: int
    num_objects: int
    objects_per_class: dict[str, int]
    output_dir: Path


def _iou(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> float:
    ix = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union else 0.0


def _colour(rng: random.Random, lo: int = 0, hi: int = 255) -> tuple[int, int, int]:
    return (rng.randint(lo, hi), rng.randint(lo, hi), rng.randint(lo, hi))


def _background(rng: random.Random, width: int, height: int) -> Image.Image:
    """A vertical two-colour gradient with clutter that is not an object."""
    top, bottom = _colour(rng, 40, 215), _colour(rng, 40, 215)
    image = Image.new("RGB", (width, height))
    draw = ImageDraw.Draw(image)
    for y in range(height):
        t = y / (height - 1)
        draw.line(
            [(0, y), (width, y)],
            fill=tuple(int(top[c] * (1 - t) + bottom[c] * t) for c in range(3)),
        )
    for _ in range(rng.randint(2, 6)):  # thin lines
        pts = [(rng.randint(0, width), rng.randint(0, height)) for _ in range(2)]
        draw.line(pts, fill=_colour(rng), width=rng.randint(1, 2))
    for _ in range(rng.randint(3, 10)):  # specks and small blobs
        x, y, r = rng.randint(0, width), rng.randint(0, height), rng.randint(1, 5)
        draw.ellipse([x - r, y - r, x + r, y + r], fill=_colour(rng))
    return image


def _draw_shape(draw: ImageDraw.ImageDraw, name: str, box, fill) -> None:
    x0, y0, x1, y1 = box
    if name == "circle":
        draw.ellipse([x0, y0, x1 - 1, y1 - 1], fill=fill)
    elif name == "square":
        draw.rectangle([x0, y0, x1 - 1, y1 - 1], fill=fill)
    elif name == "diamond":
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        draw.polygon([(cx, y0), (x1 - 1, cy), (cx, y1 - 1), (x0, cy)], fill=fill)
    else:
        draw.polygon([((x0 + x1) / 2, y0), (x1 - 1, y1 - 1), (x0, y1 - 1)], fill=fill)


def _place_objects(rng: random.Random, width: int, height: int,
                   object_size: tuple[int, int] = (MIN_OBJECT, MAX_OBJECT),
                   classes: tuple[str, ...] = CLASSES, count: tuple[int, int] = OBJECTS) -> list[DemoObject]:
    objects: list[DemoObject] = []
    wanted = rng.randint(*count)
    smallest, largest = object_size[0], min(object_size[1], width, height)
    for _ in range(max(50, 10 * wanted)):  # bounded tries; an image keeps what fitted
        if len(objects) == wanted:
            break
        name = rng.choice(classes)
        w = rng.randint(min(smallest, largest), largest)
        # Squares and circles stay square; triangles may be a little wide or tall.
        h = w if name != "triangle" else min(height, max(smallest, int(w * rng.uniform(0.8, 1.2))))
        x0, y0 = rng.randint(0, width - w), rng.randint(0, height - h)
        box = (x0, y0, x0 + w, y0 + h)
        if all(_iou(box, o.box) <= MAX_OVERLAP_IOU for o in objects):
            objects.append(DemoObject(name, box))
    return objects


def render_demo_image(seed: int, object_size: tuple[int, int] = (MIN_OBJECT, MAX_OBJECT),
                      image_size: tuple[int, int] = (IMAGE_SIZE, IMAGE_SIZE),
                      classes: tuple[str, ...] = CLASSES,
                      count: tuple[int, int] = OBJECTS) -> tuple[Image.Image, list[DemoObject]]:
    """Render one image and its objects; the same seed gives the same image. Each image
    side is drawn from the `image_size` range (a square when it is one value), each
    object side from `object_size` (capped by the image), the number of objects from
    `count` (fewer when they do not fit without overlapping)."""
    rng = random.Random(seed)
    if image_size[0] == image_size[1]:  # no draw: the built-in demo's random sequence stays as it was
        width = height = image_size[0]
    else:
        width, height = rng.randint(*image_size), rng.randint(*image_size)
    image = _background(rng, width, height)
    objects = _place_objects(rng, width, height, object_size, classes, count)
    draw = ImageDraw.Draw(image)
    for obj in objects:
        fill = _colour(rng)
        _draw_shape(draw, obj.name, obj.box, fill)
    return image, objects


def voc_xml(filename: str, width: int, height: int, objects: list[DemoObject]) -> bytes:
    """Pascal VOC annotation for one image."""
    root = ET.Element("annotation")
    ET.SubElement(root, "folder").text = "images"
    ET.SubElement(root, "filename").text = filename
    size = ET.SubElement(root, "size")
    for tag, value in (("width", width), ("height", height), ("depth", 3)):
        ET.SubElement(size, tag).text = str(value)
    for obj in objects:
        node = ET.SubElement(root, "object")
        ET.SubElement(node, "name").text = obj.name
        ET.SubElement(node, "difficult").text = "0"
        bndbox = ET.SubElement(node, "bndbox")
        for tag, value in zip(("xmin", "ymin", "xmax", "ymax"), obj.box):
            ET.SubElement(bndbox, tag).text = str(value)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def coco_instances(entries: list[tuple[str, int, int, list[DemoObject]]], classes: tuple[str, ...] = CLASSES) -> dict:
    """The same annotations as a COCO instances document (boxes as pixel xywh)."""
    categories = [{"id": i, "name": name} for i, name in enumerate(classes, start=1)]
    cat_ids = {c["name"]: c["id"] for c in categories}
    images, annotations = [], []
    for image_id, (filename, width, height, objects) in enumerate(entries, start=1):
        images.append({"id": image_id, "file_name": filename, "width": width, "height": height})
        for obj in objects:
            x0, y0, x1, y1 = obj.box
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": cat_ids[obj.name],
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 0})
    return {"images": images, "annotations": annotations, "categories": categories}


def csv_rows(entries: list[tuple[str, int, int, list[DemoObject]]]) -> str:
    """The same annotations as a TF OD API-style CSV, one row a box."""
    lines = ["filename,width,height,class,xmin,ymin,xmax,ymax"]
    for filename, width, height, objects in entries:
        lines += [f"{filename},{width},{height},{o.name},{o.box[0]},{o.box[1]},{o.box[2]},{o.box[3]}" for o in objects]
    return "\n".join(lines) + "\n"


def write_demo_dataset(
    output_dir: Path, num_train: int = 1024, num_val: int = 128, seed: int = 0,
    object_size: tuple[int, int] = (MIN_OBJECT, MAX_OBJECT), image_size: tuple[int, int] = (IMAGE_SIZE, IMAGE_SIZE),
    classes: tuple[str, ...] = CLASSES, first_index: int = 0, objects: tuple[int, int] = OBJECTS,
) -> DemoSummary:
    """Write `num_train + num_val` images under `output_dir`, annotated three ways:
    VOC XML in `annotations/`, COCO JSON in `coco.json`, CSV in `labels.csv`. Object and
    image sides are drawn from the `object_size` and `image_size` ranges (min, max) in
    pixels, and the number of objects in an image from `objects`; the defaults (1-3 shapes
    of 26-58 px in 128 px squares) make the built-in demo.
    `classes` may add "diamond" to the three shapes (a class a model trained on the demo
    never saw); `first_index` numbers the files from there (more images for the same folder).

    The train/val split is left to `detpipe data build` (a hash of the image id);
    the two counts only set how many images are made.
    """
    output_dir = Path(output_dir)
    (output_dir / "images").mkdir(parents=True, exist_ok=True)
    (output_dir / "annotations").mkdir(parents=True, exist_ok=True)
    total = num_train + num_val
    per_class = {name: 0 for name in classes}
    num_objects = 0
    entries = []
    count = objects  # the loop below names each image's objects `objects`
    for index in range(first_index, first_index + total):
        image, objects = render_demo_image(seed * 1_000_003 + index, object_size=object_size, image_size=image_size,
                                           classes=classes, count=count)
        stem = f"demo-{index:06d}"
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=92)
        (output_dir / "images" / f"{stem}.jpg").write_bytes(buffer.getvalue())
        (output_dir / "annotations" / f"{stem}.xml").write_bytes(
            voc_xml(f"{stem}.jpg", image.width, image.height, objects)
        )
        entries.append((f"{stem}.jpg", image.width, image.height, objects))
        for obj in objects:
            per_class[obj.name] += 1
        num_objects += len(objects)
        if (index + 1 - first_index) % 500 == 0:
            logger.info("demo-data: %d/%d images", index + 1 - first_index, total)
    (output_dir / "coco.json").write_text(json.dumps(coco_instances(entries, classes), indent=1) + "\n")
    (output_dir / "labels.csv").write_text(csv_rows(entries))
    return DemoSummary(total, num_objects, per_class, output_dir)
