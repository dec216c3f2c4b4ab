"""CSV reader in the TF OD API style: `filename,width,height,class,xmin,ymin,xmax,ymax`,
one row a box. Rows of the same file name form one record, in order of first appearance. A
row whose class and coordinates are all empty (`neg.jpg,640,480,,,,,`) names an image with
no boxes (a negative), as tools that export every image write it.
"""

from __future__ import annotations

import csv
import io

from apache_beam.io.filesystems import FileSystems

from beam.contract.rejects import BAD_ANNOTATION, Reject
from beam.source_records import (AnnotationError, SourceBox, SourceRecord, image_id_from_filename, number_or_nan,
                                 optional_size)

COLUMNS = ("filename", "width", "height", "class", "xmin", "ymin", "xmax", "ymax")
BOX_COLUMNS = COLUMNS[3:]


def parse_csv(data: bytes, source: str) -> list[SourceRecord | Reject]:
    """Records grouped by file name; a file whose rows disagree on its size is rejected."""
    text = data.decode("utf-8-sig")
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise AnnotationError(f"{source}: missing CSV columns {', '.join(missing)}; expected {','.join(COLUMNS)}")
    groups: dict[str, dict] = {}
    for line, row in enumerate(reader, start=2):
        name = (row.get("filename") or "").strip()
        if not name:
            groups.setdefault(f"<line {line}>", {"lines": [line], "sizes": set(), "boxes": [], "error": "no filename"})
            continue
        group = groups.setdefault(name, {"lines": [], "sizes": set(), "boxes": [], "error": None})
        group["lines"].append(line)
        # NaN != NaN: sizes given as "nan" (or not at all) are compared as "not given"
        group["sizes"].add((optional_size(number_or_nan(row["width"])), optional_size(number_or_nan(row["height"]))))
        if None in row.values() or None in row:
            group["error"] = f"line {line} has the wrong number of columns"
        if not any((row[c] or "").strip() for c in BOX_COLUMNS):
            continue  # the image has no boxes
        group["boxes"].append(SourceBox(
            class_text=(row.get("class") or "").strip(),
            xmin=number_or_nan(row["xmin"]), ymin=number_or_nan(row["ymin"]), xmax=number_or_nan(row["xmax"]), ymax=number_or_nan(row["ymax"]),
        ))
    out: list[SourceRecord | Reject] = []
    for name, group in groups.items():
        lines = group["lines"]
        ref = f"{source}:{lines[0]}" if len(lines) == 1 else f"{source}:{lines[0]}-{lines[-1]}"
        image_id = image_id_from_filename(name)
        if group["error"]:
            out.append(Reject(image_id, BAD_ANNOTATION, group["error"], ref))
            continue
        if len(group["sizes"]) > 1:
            out.append(Reject(image_id, BAD_ANNOTATION,
                              f"rows disagree on the image size: {sorted(group['sizes'], key=str)}", ref))
            continue
        width, height = next(iter(group["sizes"]))
        out.append(SourceRecord(
            image_id=image_id, filename=name, width=width, height=height,
            boxes=tuple(group["boxes"]), source_ref=ref,
        ))
    return out


def read_csv(path: str) -> list[SourceRecord | Reject]:
    with FileSystems.open(path) as handle:
        return parse_csv(handle.read(), path)
