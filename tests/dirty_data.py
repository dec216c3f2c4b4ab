"""A dirty copy of a real VOC dataset: the source's records plus one record for each fault the
data step knows, and a few awkward images it must accept. The tests run the real data step
(and the whole DAG) on it, so every reader of its outputs sees real rejects of every kind.

`make_dirty_copy(raccoon/images, raccoon/annotations, root)` returns what each record should
become: rejected (with the reason), written with some boxes dropped, or written as is.
"""

from __future__ import annotations

import io
import json
import shutil
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

from beam.contract.exif import ORIENTATION_TAG
from beam.source_records import image_id_from_filename

PREFIX = "dirty-"


@dataclass
class DirtyData:
    images: Path
    annotations: Path
    template_id: str  # the source record the faults are made from
    image_rejects: dict[str, str] = field(default_factory=dict)  # image id -> reason
    box_rejects: dict[tuple[str, int], str] = field(default_factory=dict)  # (image id, box index) -> reason
    kept_boxes: dict[str, int] = field(default_factory=dict)  # image id -> boxes written despite drops
    accepted: dict[str, str] = field(default_factory=dict)  # image id -> what is odd about it
    split_file: Path | None = None
    label_map: dict[str, int] | None = None
    hostile_class: str | None = None  # a class named as markup, with a right-to-left override
    hostile_file: str | None = None  # a photo's file name that is markup
    max_pixels: int | None = None

    @property
    def reasons(self) -> set[str]:
        return set(self.image_rejects.values()) | set(self.box_rejects.values())


def _box(obj: ET.Element) -> list[str]:
    return [obj.findtext(f"bndbox/{k}") for k in ("xmin", "ymin", "xmax", "ymax")]


def _object(name: str, coords) -> ET.Element:
    obj = ET.Element("object")
    ET.SubElement(obj, "name").text = name
    box = ET.SubElement(obj, "bndbox")
    for key, value in zip(("xmin", "ymin", "xmax", "ymax"), coords):
        ET.SubElement(box, key).text = str(value)
    return obj


def _encoded(image: Image.Image, fmt: str, **kwargs) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **kwargs)
    return out.getvalue()


def refused_by_tensorflow(jpeg: bytes) -> bytes:
    """The JPEG with one byte of its entropy-coded data set to 0xFF, at the first place (from
    the middle of the scan on) where Pillow still loads it and TensorFlow's decoder refuses it:
    the damage the issue found in `raccoon-1.jpg` (byte 36141), made for any photo."""
    from beam.contract.decoding import decode_problem

    scan = jpeg.index(b"\xff\xda")  # start of scan: the entropy-coded data follows its header
    for position in range((scan + len(jpeg)) // 2, len(jpeg) - 2):
        if jpeg[position] == 0xFF or jpeg[position + 1] == 0xFF:
            continue
        damaged = jpeg[:position] + b"\xff" + jpeg[position + 1:]
        try:
            Image.open(io.BytesIO(damaged)).load()
        except (OSError, SyntaxError):
            continue
        if decode_problem(damaged):
            return damaged
    raise AssertionError("no single byte makes TensorFlow refuse this JPEG while Pillow reads it")


def make_dirty_copy(images: Path, annotations: Path, root: Path, *, split_file: bool = False,
                    label_map: bool = False, reject_empty: bool = False, max_pixels: bool = False,
                    hostile: bool = False, keep=None) -> DirtyData:
    """Copy a VOC dataset to `root` and add the faults. The faults that need an option of the
    data step (`label_map`: an unknown class; `reject_empty`: an image without boxes;
    `max_pixels`: an image over the limit; `split_file`: an image the split file leaves out)
    are added only when asked for; the returned `DirtyData` carries the option's value.
    `hostile`: what a stranger's export can hold: a class and a file named as markup (written:
    every page must show them as text) and two photos named by paths outside the images folder
    (rejected, never read). `keep(stem)`: the source files copied, by their name without
    its extension (all when None)."""
    out_images, out_annotations = root / "images", root / "annotations"

    def left_out(_folder, names: list[str]) -> list[str]:
        return [] if keep is None else [n for n in names if not keep(Path(n).stem)]

    shutil.copytree(images, out_images, ignore=left_out)
    shutil.copytree(annotations, out_annotations, ignore=left_out)
    sources = sorted(out_annotations.glob("*.xml"))
    template = next(p for p in sources if ET.parse(p).getroot().find("object") is not None)
    tree = ET.parse(template).getroot()
    photo = Image.open(out_images / tree.findtext("filename"))
    photo.load()
    width, height = int(tree.findtext("size/width")), int(tree.findtext("size/height"))
    assert photo.size == (width, height), "the template's annotation must match its image"
    jpeg = (out_images / tree.findtext("filename")).read_bytes()
    data = DirtyData(out_images, out_annotations, template.stem)
    class_name = tree.findtext("object/name")

    def variant(name: str, image_bytes: bytes | None = None, ext: str = "jpg", edit=None,
                reason: str | None = None, filename: str | None = None, xml_name: str | None = None) -> str:
        root_el = ET.parse(template).getroot()
        root_el.find("filename").text = filename or f"{PREFIX}{name}.{ext}"
        if edit:
            edit(root_el)
        (out_annotations / f"{xml_name or PREFIX + name}.xml").write_bytes(ET.tostring(root_el))
        if image_bytes is not None:
            (out_images / f"{PREFIX}{name}.{ext}").write_bytes(image_bytes)
        image_id = image_id_from_filename(filename or f"{PREFIX}{name}.{ext}")
        if reason:
            data.image_rejects[image_id] = reason
        return image_id

    def set_text(path: str, value: str):
        return lambda r: setattr(r.find(path), "text", value)

    # Rejected whole: the image or the whole annotation cannot be trusted.
    variant("truncated", jpeg[: len(jpeg) // 2], reason="unreadable_image")
    variant("tf-refuses", refused_by_tensorflow(jpeg), reason="tensorflow_cannot_decode")  # Pillow reads it
    variant("missing", None, reason="missing_image")
    variant("icon", _encoded(photo.convert("RGB"), "ICO"), ext="ico", reason="unsupported_format")
    variant("wrongsize", jpeg, edit=set_text("size/width", str(width + 7)), reason="size_mismatch")
    variant("noclass", jpeg, edit=set_text("object/name", ""), reason="bad_annotation")
    (out_annotations / f"{PREFIX}broken.xml").write_text("<annotation><filename>x.jpg</filename")
    data.image_rejects[f"{PREFIX}broken"] = "bad_annotation"
    # A second annotation of the template's image: the later source (by name) is the duplicate.
    variant("duplicate", filename=tree.findtext("filename"), xml_name="zz-" + PREFIX + "duplicate")
    data.image_rejects[template.stem + "#duplicate"] = "duplicate_image_id"

    # Written, with the boxes that cannot be trusted on their own dropped.
    originals = len(tree.findall("object"))
    bad_boxes = [("invalid_box", (40, 10, 40, 30)),  # zero width: xmin = xmax
                 ("box_outside_image", (width + 100, 10, width + 400, 50)),  # far outside
                 ("invalid_box", ("nan", 5, 30, 30)),
                 ("invalid_box", (30, 40, 10, 60)),  # inverted
                 ("invalid_box", (width + 1, 10, width + 2, 30))]  # within the clip margin, nothing left once clipped

    def add_bad_boxes(root_el):
        for _, coords in bad_boxes:
            root_el.append(_object(class_name, coords))

    boxes_id = variant("bad-boxes", jpeg, edit=add_bad_boxes)
    for index, (reason, _) in enumerate(bad_boxes, start=originals):
        data.box_rejects[(boxes_id, index)] = reason
    data.kept_boxes[boxes_id] = originals

    # Every box bad: a negative (no boxes left), or with reject_empty a `no_boxes` reject.
    def only_bad_boxes(root_el):
        for obj in root_el.findall("object"):
            root_el.remove(obj)
        for _, coords in bad_boxes[:2]:
            root_el.append(_object(class_name, coords))

    negative_id = variant("all-bad", jpeg, edit=only_bad_boxes, reason="no_boxes" if reject_empty else None)
    if not reject_empty:
        data.box_rejects.update({(negative_id, i): reason for i, (reason, _) in enumerate(bad_boxes[:2])})
        data.kept_boxes[negative_id] = 0

    # Accepted: colour modes, an EXIF-rotated phone photo annotated as displayed, a GIF (written as PNG).
    data.accepted[variant("alpha", _encoded(photo.convert("RGBA"), "PNG"), ext="png")] = "RGBA"
    data.accepted[variant("gif", _encoded(photo.convert("RGB"), "GIF"), ext="gif")] = "GIF"
    data.accepted[variant("grey", _encoded(photo.convert("L"), "PNG"), ext="png")] = "L"
    exif = Image.Exif()
    exif[ORIENTATION_TAG] = 6  # stored turned; a viewer turns it back to the annotated frame
    stored = photo.convert("RGB").transpose(Image.Transpose.ROTATE_90)
    data.accepted[variant("exif", _encoded(stored, "JPEG", quality=92, exif=exif.tobytes()))] = "exif:6"

    if label_map:
        variant("unknown", jpeg, edit=set_text("object/name", "badger"), reason="unknown_class")
        names = {o.findtext("name") for p in sources for o in ET.parse(p).getroot().iter("object")}
        data.label_map = {name: i for i, name in enumerate(sorted(names), start=1)}
    if reject_empty:
        variant("empty", jpeg, edit=lambda r: [r.remove(o) for o in r.findall("object")], reason="no_boxes")
    if max_pixels:
        largest = max(Image.open(p).size[0] * Image.open(p).size[1] for p in out_images.iterdir()
                      if p.suffix in (".jpg", ".png"))
        data.max_pixels = largest  # every other image passes; the one made below does not
        scale = int((largest / (width * height)) ** 0.5) + 1
        big = photo.convert("RGB").resize((width * scale, height * scale))
        variant("huge", _encoded(big, "JPEG"), edit=lambda r: (set_text("size/width", str(big.width))(r),
                                                             set_text("size/height", str(big.height))(r)),
                reason="image_too_large")
    if hostile:
        data.hostile_class = "<script>alert(1)</script>\u202eredro"
        data.hostile_file = '"><img src=x onerror=alert(3)>'
        variant("markup-class", jpeg, edit=set_text("object/name", data.hostile_class))
        if data.label_map is not None:  # a class of the model in use, as the stranger's export names it
            data.label_map[data.hostile_class] = max(data.label_map.values()) + 1
        (out_images / f"{data.hostile_file}.jpg").write_bytes(jpeg)
        variant("markup-file", filename=f"{data.hostile_file}.jpg", xml_name=data.hostile_file)
        (root / "outside").mkdir()
        for name, written_as in (("climbs", f"../outside/{PREFIX}climbs.jpg"),
                                 ("absolute", str(root / "outside" / f"{PREFIX}absolute.jpg"))):
            (root / "outside" / f"{PREFIX}{name}.jpg").write_bytes(jpeg)
            variant(name, filename=written_as, reason="image_outside_folder")
    if split_file:
        unlisted = variant("unlisted", jpeg, reason="not_in_split_file")
        ids = sorted({p.stem for p in out_annotations.glob("*.xml")} - {unlisted, "zz-" + PREFIX + "duplicate"})
        split = {"train": [i for n, i in enumerate(ids) if n % 5], "val": [i for n, i in enumerate(ids) if not n % 5]}
        data.split_file = root / "split.json"
        data.split_file.write_text(json.dumps(split, indent=1))
    return data


def split_of(data: DirtyData) -> dict[str, str]:
    """{image id: split} of the split file."""
    listed = json.loads(data.split_file.read_text())
    return {image_id: split for split, ids in listed.items() for image_id in ids}
