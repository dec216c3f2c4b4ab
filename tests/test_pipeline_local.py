"""The real DAG, end to end, with the KFP local runner on a tiny demo dataset."""

import json
import math

import tensorflow as tf

from beam import feature_keys as K
from beam.example_codec import decode_example
from pipeline.cli import main


def test_run_local_end_to_end(demo_dir, tmp_path, capsys):
    summary_file = tmp_path / "summary.json"
    code = main(["run", "--local", "--images", str(demo_dir / "images"), "--annotations",
                 str(demo_dir / "annotations"), "--epochs", "1", "--batch-size", "8", "--image-size", "96",
                 "--pipeline-root", str(tmp_path / "root"), "--summary-json", str(summary_file)])
    assert code == 0
    out = capsys.readouterr().out
    assert "detpipe run summary" in out and "mAP@[.5:.95]" in out
    summary = json.loads(summary_file.read_text())
    run_dir = tmp_path / "root" / summary["run_dir"].rsplit("/", 1)[-1]

    dataset = run_dir / "validate-and-convert" / "dataset"
    manifest = json.loads((dataset / "manifest.json").read_text())
    assert manifest["records_in"] == 64 == manifest["written_total"] + manifest["rejected"]
    assert summary["records_in"] == 64 and summary["written"] == manifest["written_total"]
    shards = sorted(dataset.glob("*.tfrecord"))
    assert [p.name for p in shards] == sorted(s["name"] for s in manifest["shards"])
    parsed = [decode_example(r.numpy()) for s in shards for r in tf.data.TFRecordDataset(str(s))]
    assert len(parsed) == manifest["written_total"]
    for ex in parsed:
        assert ex[K.FORMAT] == [b"jpeg"] and ex[K.ENCODED][0][:2] == b"\xff\xd8"
        n = len(ex[K.CLASS_LABEL])
        assert n == len(ex[K.XMIN]) == len(ex[K.YMAX]) == len(ex[K.CLASS_TEXT]) >= 1
        assert all(0.0 <= v <= 1.0 for key in K.BOX_KEYS for v in ex[key])

    assert summary["probe_verdict"] in ("PASS", "WARN")
    assert (run_dir / "probe" / "report").read_text().startswith("# Environment probe")
    assert (run_dir / "train" / "model" / "model.keras").stat().st_size > 0
    hparams = json.loads((run_dir / "tune-hyperparameters" / "hparams" / "best_hparams.json").read_text())
    assert hparams["search"]["trials"] == 0  # tune_trials defaults to 0: the defaults, no search
    train_config = json.loads((run_dir / "train" / "model" / "train_config.json").read_text())
    assert train_config["train"]["base_lr_per_64"] == hparams["base_lr_per_64"]
    metrics = json.loads((run_dir / "evaluate" / "metrics_json").read_text())
    assert math.isfinite(metrics["metrics"]["mAP"]) and math.isfinite(metrics["metrics"]["AP50"])
    assert summary["metrics"]["mAP"] == metrics["metrics"]["mAP"]
