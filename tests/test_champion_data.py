"""The data step checked against the champion: its schema (a class it never saw is named)
and its training statistics (drift), with the class ids it used."""

import json
import shutil

import pytest

from beam.convert_job import build_dataset
from beam.options import ConvertOptions, GateOptions, with_champion

CHAMPION_FILES = ("schema.pbtxt", "stats-train.pb")


def _build(images, annotations, out, champion_dir, gates=GateOptions()):
    files = {name: str(champion_dir / name) for name in CHAMPION_FILES}
    base = json.loads((champion_dir / "label_map.json").read_text())
    return build_dataset(ConvertOptions(images=str(images), annotations=str(annotations), output=str(out),
                                        val_fraction=0.25, base_label_map=base,
                                        gates=with_champion(gates, files, "v1")))


@pytest.mark.slow
def test_new_class_is_named_and_can_be_allowed(demo_dir, demo_shards, tmp_path):
    same = _build(demo_dir / "images", demo_dir / "annotations", tmp_path / "same", demo_shards)
    assert same.ok and same.anomalies == []  # the champion's own data: no anomaly, no drift

    annotations = tmp_path / "annotations"
    shutil.copytree(demo_dir / "annotations", annotations)
    renamed = 0
    for xml in sorted(annotations.glob("*.xml"))[:12]:
        text = xml.read_text()
        renamed += text.count("<name>triangle</name>")
        xml.write_text(text.replace("<name>triangle</name>", "<name>hexagon</name>"))
    assert renamed

    refused = _build(demo_dir / "images", annotations, tmp_path / "refused", demo_shards)
    assert not refused.ok
    named = [line for line in refused.anomalies if "hexagon" in line]
    assert len(named) == 1 and "new class" in named[0] and "champion v1" in named[0]
    assert "allow_new_classes" in named[0]

    allowed = _build(demo_dir / "images", annotations, tmp_path / "allowed", demo_shards,
                     GateOptions(allow_new_classes=True))
    assert allowed.ok, allowed.anomalies
    label_map = json.loads((tmp_path / "allowed" / "label_map.json").read_text())
    champion_map = json.loads((demo_shards / "label_map.json").read_text())
    assert {k: label_map[k] for k in champion_map} == champion_map  # known classes keep their ids
    assert label_map["hexagon"] == max(champion_map.values()) + 1
