"""Pascal VOC reader: one XML file per image → `SourceRecord`."""

from __future__ import annotations

import glob
import xml.etree.ElementTree as ET

from apache_beam.io.filesystems import FileSystems

from beam.file_bytes import read_bytes
from beam.source_records import (
    AnnotationError, SourceBox, SourceRecord, image_id_from_filename, number_or_nan, optional_size,
)


def list_voc_files(annotations_dir: str) -> list[str]:
    """Every `*.xml` under `annotations_dir` (local or gs://), sorted for determinism."""
    pattern = FileSystems.join(annotations_dir.rstrip("/"), "*.xml")
    if FileSystems.get_scheme(pattern) is None:
        # Local: the glob Beam's own match runs, without the size it then reads of each file
        # (0.12 -> 0.03 s for 20,000 files).
        return sorted(glob.glob(pattern))
    matches = FileSystems.match([pattern])[0].metadata_list
    return sorted(m.path for m in matches)


def _number(node: ET.Element | None, tag: str) -> float:
    return number_or_nan(node.findtext(tag) if node is not None else None)


def parse_voc_xml(data: bytes, source_ref: str) -> SourceRecord:
    """Parse one VOC annotation. The image id is the file name without extension (the XML
    file's own name when it has no <filename>).

    Missing numbers become NaN so that the record checks reject them with a reason,
    rather than the reader failing the whole job.
    """
    try:
        root = ET.fromstring(data)
    except ET.ParseError as err:
        raise AnnotationError(f"not valid XML: {err}") from err
    # No <filename> (some converters leave it out): the image named like the XML file, with
    # any image suffix (job_transforms.image_file_names looks for each).
    filename = (root.findtext("filename") or "").strip() or image_id_from_filename(source_ref.removesuffix(".xml"))
    size = root.find("size")
    width, height = _number(size, "width"), _number(size, "height")
    boxes = []
    for obj in root.findall("object"):
        bndbox = obj.find("bndbox")
        difficult = obj.findtext("difficult", default="0").strip() in ("1", "true")
        boxes.append(SourceBox(
            class_text=(obj.findtext("name") or "").strip(),
            xmin=_number(bndbox, "xmin"), ymin=_number(bndbox, "ymin"),
            xmax=_number(bndbox, "xmax"), ymax=_number(bndbox, "ymax"),
            difficult=difficult,
        ))
    return SourceRecord(
        image_id=image_id_from_filename(filename),
        filename=filename,
        width=optional_size(width),
        height=optional_size(height),
        boxes=tuple(boxes),
        source_ref=source_ref,
    )


def read_voc_file(path: str, filesystem_of=FileSystems.get_filesystem) -> SourceRecord:
    """The record of one VOC XML file; `filesystem_of` a `FileSystemOf` where many are read."""
    return parse_voc_xml(read_bytes(path, filesystem_of), source_ref=path)
