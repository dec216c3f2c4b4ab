"""TFLite files of a trained detector, each re-scored on the val split against the model
(components/export/tflite_file.py, rescore.py, `detpipe export --format`)."""

import json

import pytest

from components.export.rescore import FORMATS_FILE, REPORT_FILE, rescore
from components.export.tflite_file import FILE_NAMES, TFLITE_KINDS, TfliteDetector, convert_tflite
from pipeline.cli import main


@pytest.fixture(scope="module")
def exported(trained_model, demo_shards, tmp_path_factory):
    """`detpipe export --format saved_model,tflite,tflite-fp16` of the session's trained model."""
    out = tmp_path_factory.mktemp("tflite")
    assert main(["export", "--model", str(trained_model), "--output", str(out), "--data", str(demo_shards),
                 "--format", "saved_model," + ",".join(TFLITE_KINDS)]) == 0
    return out


@pytest.mark.slow
def test_each_tflite_file_converts_and_scores_as_the_trained_model(exported, capsys):
    assert (exported / "saved_model.pb").exists()  # the SavedModel beside them, as asked
    report = json.loads((exported / FORMATS_FILE).read_text())
    base = report["trained_model"]
    assert base["mAP"] > 0  # the comparison compares something
    scores = {s["kind"]: s for s in report["formats"]}
    assert set(scores) == set(TFLITE_KINDS)
    for kind, score in scores.items():
        assert score["passed"] and abs(score["map_difference"]) <= score["tolerance"], score
        assert score["file"].endswith(FILE_NAMES[kind]) and score["size_bytes"] > 0
        assert score["top_score_difference"] < 0.01 and score["seconds_per_image"] > 0
    assert scores["tflite"]["top_box_difference"] < 1e-3  # float32: the same numbers, nearly
    assert scores["tflite-fp16"]["size_bytes"] < 0.6 * scores["tflite"]["size_bytes"]
    page = (exported / REPORT_FILE).read_text()
    assert "| tflite | pass (tolerance 0.02)" in page and "| tflite-fp16 | pass" in page


@pytest.mark.slow
def test_the_file_answers_one_image_at_the_model_size_with_nms_inside(exported, trained_model):
    from components.detector.artifacts import load_trained

    _, config = load_trained(str(trained_model))
    detector = TfliteDetector(str(exported / FILE_NAMES["tflite"]))
    assert detector.image_size == config.image_size
    import numpy as np

    out = detector(np.zeros((2, config.image_size, config.image_size, 3), np.float32))
    assert out["boxes"].shape[:1] == (2,) and out["boxes"].shape[2] == 4 and out["num_detections"].shape == (2,)
    assert out["confidence"].shape == out["labels"].shape == out["boxes"].shape[:2]


@pytest.mark.slow
def test_a_file_under_its_tolerance_is_marked_failed_with_its_numbers(exported, trained_model, demo_shards, tmp_path):
    """A tolerance no file can meet (it would have to gain a whole mAP point over the model)."""
    files = {"tflite": str(exported / FILE_NAMES["tflite"])}
    base, (score,) = rescore(str(trained_model), str(demo_shards), files, tolerance=-1.0, output_dir=str(tmp_path))
    assert not score.passed and score.line.startswith("tflite: FAILED: mAP ")
    assert f"{score.map_difference:+.4f} vs the trained model, tolerance -1" in score.line
    assert "| tflite | FAILED (tolerance -1)" in (tmp_path / REPORT_FILE).read_text()


def test_export_refuses_a_converted_format_without_data_and_an_unknown_one(trained_model, tmp_path, capsys):
    assert main(["export", "--model", str(trained_model), "--output", str(tmp_path), "--format", "tflite"]) != 0
    assert "give --data" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", "--model", str(trained_model), "--output", str(tmp_path), "--format", "onnx"])
    assert "formats are saved_model, tflite, tflite-fp16" in capsys.readouterr().err


def test_an_unknown_kind_is_refused_before_any_work(trained_model, tmp_path):
    with pytest.raises(ValueError, match="kind must be one of"):
        convert_tflite(str(trained_model), {"tflite-int4": str(tmp_path / "m.tflite")})


@pytest.mark.slow
def test_predict_on_the_tflite_file_answers_as_the_saved_model(exported, demo_dir, capsys):
    """`detpipe predict --model FILE.tflite`: the same JSON lines as the SavedModel beside it,
    on 4 photos (boxes and scores within 1e-5, classes and names the same)."""
    import numpy as np

    photos = [str(p) for p in sorted((demo_dir / "images").glob("*.jpg"))[:4]]
    answers = {}
    for model in (str(exported), str(exported / FILE_NAMES["tflite"])):
        capsys.readouterr()
        assert main(["predict", "--model", model, "--score-threshold", "0.05", *photos]) == 0
        answers[model] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    saved, tflite = answers.values()
    assert len(saved) == len(tflite) == 4 and sum(a["num_detections"] for a in saved) > 0
    for a, b in zip(saved, tflite):
        assert a["image"] == b["image"] and a["num_detections"] == b["num_detections"]
        assert a["detection_classes"] == b["detection_classes"]
        assert a["detection_class_names"] == b["detection_class_names"]
        if a["num_detections"]:
            assert np.abs(np.subtract(a["detection_boxes"], b["detection_boxes"])).max() <= 1e-5
            assert np.abs(np.subtract(a["detection_scores"], b["detection_scores"])).max() <= 1e-5
