"""CSV reader in the TF OD API style: `filename,width,height,class,xmin,ymin,xmax,ymax`,
one row a box. Rows of the same file name form one record, in order of first appearance.
"""

from __future__ import annotations

import csv
import io
import math

from apache_beam.io.filesystems import FileSystems

from beam.source_records import Reject, SourceBox, SourceRecord
from beam.voc_reader import AnnotationError

COLUMNS = ("filename", "width", "height", "class", "xmin", "ymin", "xmax", "ymax")
BAD_ANNOTATION = "bad_annotation"


def _float(value: str | None) -> float:
    try:
        return float(value) if value not in (None, "") else math.nan
    except ValueError:
        return math.nan


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
        group["sizes"].add((_float(row["width"]), _float(row["height"])))
        if None in row.values() or None in row:
            group["error"] = f"line {line} has the wrong number of columns"
        group["boxes"].append(SourceBox(
            class_text=(row.get("class") or "").strip(),
            xmin=_float(row["xmin"]), ymin=_float(row["ymin"]), xmax=_float(row["xmax"]), ymax=_float(row["ymax"]),
        ))
    out: list[SourceRecord | Reject] = []
    for name, group in groups.items():
        lines = group["lines"]
        ref = f"{source}:{lines[0]}" if len(lines) == 1 else f"{source}:{lines[0]}-{lines[-1]}"
        image_id = name.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        if group["error"]:
            out.append(Reject(image_id, BAD_ANNOTATION, group["error"], ref))
            continue
        if len(group["sizes"]) > 1:
            out.append(Reject(image_id, BAD_ANNOTATION,
                              f"rows disagree on the image size: {sorted(group['sizes'])}", ref))
            continue
        width, height = next(iter(group["sizes"]))
        out.append(SourceRecord(
            image_id=image_id, filename=name,
            width=None if math.isnan(width) else int(width), height=None if math.isnan(height) else int(height),
            boxes=tuple(group["boxes"]), source_ref=ref,
        ))
    return out


def read_csv(path: str) -> list[SourceRecord | Reject]:
    with FileSystems.open(path) as handle:
        return parse_csv(handle.read(), path)
