"""TFDV gates: a pinned-schema violation and a drift each fail with the feature named;
--allow-anomalies lets them pass with a warning."""

import pytest

from beam.contract import feature_keys as K
from beam.convert_job import build_dataset
from beam.options import ConvertOptions, GateOptions
from pipeline.cli import main


@pytest.fixture(scope="module")
def reference(demo_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    result = build_dataset(ConvertOptions(images=str(demo_dir / "images"), annotations=str(demo_dir / "labels.csv"),
                                          output=str(out), data_format="csv", val_fraction=0.25))
    assert result.anomalies == []
    return out


def _csv_variant(demo_dir, tmp_path, edit) -> str:
    lines = (demo_dir / "labels.csv").read_text().splitlines()
    path = tmp_path / "labels.csv"
    path.write_text("\n".join([lines[0], *filter(None, map(edit, lines[1:]))]) + "\n")
    return str(path)


def _build(demo_dir, csv_path, out, **kwargs):
    return build_dataset(ConvertOptions(images=str(demo_dir / "images"), annotations=csv_path, output=str(out),
                                        data_format="csv", val_fraction=0.25, **kwargs))


def test_pinned_schema_violation_names_the_feature(demo_dir, reference, tmp_path):
    renamed = _csv_variant(demo_dir, tmp_path, lambda row: row.replace(",square,", ",hexagon,"))
    result = _build(demo_dir, renamed, tmp_path / "out",
                    gates=GateOptions(schema_file=str(reference / "schema.pbtxt")))
    assert not result.ok
    assert any(line.split("]", 1)[1].strip().startswith(K.CLASS_TEXT) and "hexagon" in line
               for line in result.anomalies), result.anomalies


def test_label_drift_beyond_threshold_fails_and_allow_passes(demo_dir, reference, tmp_path, capsys):
    circles_only = _csv_variant(demo_dir, tmp_path, lambda row: row if ",circle," in row else None)
    previous = str(reference / "stats-train.pb")
    result = _build(demo_dir, circles_only, tmp_path / "a", gates=GateOptions(previous_stats=previous,
                                                                               max_reject_fraction=1.0))
    drift = [line for line in result.anomalies if line.startswith("[drift")]
    assert not result.ok and drift and K.CLASS_TEXT in drift[0]
    # The same through the CLI: exit 1 with a table naming the feature, then exit 0 when allowed.
    argv = ["data", "build", "--format", "csv", "--images", str(demo_dir / "images"), "--annotations",
            circles_only, "--val-fraction", "0.25", "--previous-stats", previous, "--max-reject-fraction", "1"]
    assert main([*argv, "--output", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err
    assert "feature | problem | detail" in err and K.CLASS_TEXT in err and "--allow-anomalies" in err
    assert main([*argv, "--output", str(tmp_path / "c"), "--allow-anomalies"]) == 0
    assert "warning" in capsys.readouterr().err


def test_look_alike_class_names_fail_the_build_and_allow_keeps_them_apart(demo_dir, tmp_path, capsys):
    """'Square' beside 'square' (one class labelled two ways) is an anomaly naming both; with
    --allow-anomalies they are two classes."""
    from beam.contract.files import read_manifest

    rows = iter(range(10**6))
    renamed = _csv_variant(demo_dir, tmp_path, lambda row: row.replace(",square,", ",Square,")
                           if ",square," in row and next(rows) % 3 == 0 else row)
    argv = ["data", "build", "--format", "csv", "--images", str(demo_dir / "images"), "--annotations", renamed,
            "--val-fraction", "0.25"]
    assert main([*argv, "--output", str(tmp_path / "a")]) == 1
    (line,) = [line for line in capsys.readouterr().err.splitlines() if "look-alike" in line]
    assert "'Square' and 'square' differ only in case" in line
    assert main([*argv, "--output", str(tmp_path / "b"), "--allow-anomalies"]) == 0
    assert set(read_manifest(str(tmp_path / "b")).class_boxes["train"]) == {"circle", "square", "Square", "triangle"}


def test_no_drift_against_itself(demo_dir, reference, tmp_path):
    result = _build(demo_dir, str(demo_dir / "labels.csv"), tmp_path / "same",
                    gates=GateOptions(previous_stats=str(reference / "stats-train.pb")))
    assert result.anomalies == []


def test_box_sizes_are_in_the_statistics(reference):
    import tensorflow_data_validation as tfdv

    stats = tfdv.load_stats_binary(str(reference / "stats-train.pb"))
    names = {f.path.step[0] for f in stats.datasets[0].features}
    assert {"detpipe/box_width", "detpipe/box_height", K.CLASS_TEXT, K.SOURCE_ID} <= names
    assert K.ENCODED not in names  # statistics over the features they describe, not over the image bytes


def test_per_image_unique_features_get_no_top_k_sketch(reference):
    """Their sketches would grow with the dataset: presence and length only."""
    import tensorflow_data_validation as tfdv

    stats = tfdv.load_stats_binary(str(reference / "stats-train.pb"))
    features = {f.path.step[0]: f for f in stats.datasets[0].features}
    for key in (K.FILENAME, K.SOURCE_ID, K.KEY_SHA256):
        assert not features[key].string_stats.top_values
        assert features[key].string_stats.common_stats.num_non_missing > 0
    assert features[K.CLASS_TEXT].string_stats.top_values  # real categories keep theirs


def _close(a, b) -> bool:
    """Equal, floats to 1e-9 relative (sums in another order)."""
    import math

    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_close, a, b))
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def test_the_statistics_are_what_tfdv_generate_statistics_computes(demo_dir, tmp_path, monkeypatch):
    """`feature_statistics` feeds TFDV's statistics generators itself, without Beam: on the features
    files a real build wrote, the same statistics as TFDV's own `GenerateStatistics` pipeline
    (guards an upgrade of TFDV, whose generators module it calls)."""
    import shutil

    import apache_beam as beam
    import tensorflow_data_validation as tfdv
    from google.protobuf.json_format import MessageToDict

    from beam import convert_job
    from beam.feature_batches import read_batches
    from beam.job_outputs import JOB_DIR, features_files
    from beam.tfdv_checks import feature_statistics, statistics_options

    kept = tmp_path / "kept"
    write_statistics = convert_job._write_statistics

    def keeping_the_job_files(out: str) -> None:
        write_statistics(out)
        shutil.copytree(f"{out}/{JOB_DIR}", kept / JOB_DIR)

    monkeypatch.setattr(convert_job, "_write_statistics", keeping_the_job_files)
    assert _build(demo_dir, str(demo_dir / "labels.csv"), tmp_path / "out").ok
    files = features_files(str(kept), "train")
    assert files
    with beam.Pipeline() as p:
        _ = (p | beam.Create(files) | beam.FlatMap(read_batches) | tfdv.GenerateStatistics(statistics_options())
             | tfdv.WriteStatisticsToBinaryFile(str(tmp_path / "beam.pb")))
    ours = feature_statistics(batch for path in files for batch in read_batches(path))
    theirs = tfdv.load_stats_binary(str(tmp_path / "beam.pb"))
    assert ours.datasets[0].num_examples > 0 and len(ours.datasets[0].features) > 10
    assert _close(MessageToDict(ours), MessageToDict(theirs))
    assert tfdv.load_stats_binary(str(tmp_path / "out" / "stats-train.pb")) == ours  # what the build published



def test_a_val_split_of_negatives_only_is_one_clear_problem_not_a_tfdv_range_error(demo_dir, tmp_path):
    """Every val image a negative (the user's split file puts only images without boxes there):
    the build names the split and why it cannot be used (no mAP to measure), once; TFDV's
    reading of the empty box features as 0s (an out-of-range class label) is not shown."""
    import json

    lines = (demo_dir / "labels.csv").read_text().splitlines()
    names = sorted({row.split(",", 1)[0] for row in lines[1:]})
    val = set(names[:4])
    rows = [row if row.split(",", 1)[0] not in val else ",".join(row.split(",")[:3] + [""] * 5) for row in lines[1:]]
    labels = tmp_path / "labels.csv"
    labels.write_text("\n".join([lines[0], *dict.fromkeys(rows)]) + "\n")  # one negative row an image
    ids = {name: name.rsplit(".", 1)[0] for name in names}
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"train": [ids[n] for n in names if n not in val], "val": [ids[n] for n in val]}))
    result = _build(demo_dir, str(labels), tmp_path / "out", split_file=str(split))
    assert not result.ok
    assert result.anomalies == ["(split val) | no boxes | its 4 image(s) hold no box (negatives, or every box "
                                "dropped): no mAP can be measured on it"]
    allowed = _build(demo_dir, str(labels), tmp_path / "allowed", split_file=str(split), allow_anomalies=True)
    assert allowed.ok and allowed.manifest.written == {"train": len(names) - 4, "val": 4}
