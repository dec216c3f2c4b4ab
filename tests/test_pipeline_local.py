"""The real DAG, end to end, with the KFP local runner on a tiny demo dataset."""

import json
import math
import re
import shutil

import pytest
import tensorflow as tf

from beam.contract import feature_keys as K
from beam.contract.codec import decode_example
from pipeline.cli import main


def _seed_champion(demo_dir, demo_shards, work, registry) -> dict:
    """v1 in an empty registry, made by the commands and functions the pipeline's steps call
    (train, the evaluate step's evaluate_against_champion, export, register_run with the
    fingerprint step's fingerprint): what a first run of the DAG leaves, at a fraction of its
    cost (the first run of a DAG on an empty registry is proved on raccoon in
    test_pipeline_dirty.py). Trained at the run's 96 px, so the run can continue its weights.
    Returns v1's decision."""
    from components.evaluate.champion import evaluate_against_champion
    from components.register.register import register_run
    from components.model_registry.decision import PromotionRule
    from components.fingerprint.fingerprint import fingerprint_source
    from components.model_registry.registry import Registry

    model, evaluation, exported = work / "model", work / "eval", work / "exported"
    assert main(["train", "--data", str(demo_shards), "--output", str(model), "--epochs", "1", "--max-steps", "2",
                 "--batch-size", "8", "--image-size", "96"]) == 0
    # `train` exports with the default threshold; `export` takes the evaluation's F1-best one.
    served = json.loads((model / "saved_model" / "serving_config.json").read_text())
    assert served["threshold_source"] == "default" and (model / "saved_model" / "saved_model.pb").exists()
    _, decision = evaluate_against_champion(str(model), str(demo_shards), str(evaluation), PromotionRule())
    chosen = json.loads((evaluation / "metrics.json").read_text())["threshold"]
    assert main(["export", "--model", str(model), "--evaluation", str(evaluation), "--output", str(exported)]) == 0
    served = json.loads((exported / "serving_config.json").read_text())
    assert served["score_threshold"] == chosen["score"] and served["threshold_source"].startswith("evaluation")
    assert json.loads((exported / "label_map.json").read_text()) == {"circle": 1, "square": 2, "triangle": 3}

    found = fingerprint_source(str(demo_dir / "images"), str(demo_dir / "annotations"))
    done = register_run(Registry.open(str(registry.parent), "detpipe"), str(exported), str(demo_shards),
                        str(evaluation / "metrics.json"), decision, found.to_dict(), "seed", train_dir=str(model))
    assert done.version == "v1" and done.status == ("blessed" if decision.blessed else "rejected")
    if not decision.blessed:  # two steps rarely beat the box-prior baseline: a person promotes it
        assert main(["registry", "promote", "v1", "--reason", "a smoke test", "--registry",
                     str(registry.parent)]) == 0
    return decision.to_dict()


@pytest.mark.slow
def test_run_local_end_to_end(demo_dir, demo_shards, tmp_path, capsys, monkeypatch):
    """One run of the whole DAG on the demo images, with a champion (v1) in the registry: the
    probe's dry run, a warm start from v1, v1 re-scored on the same val images, unchanged data
    said, a TFLite file re-scored and registered with v2, the report."""
    import tempfile

    registry = tmp_path / "root" / "registry" / "detpipe"
    _seed_champion(demo_dir, demo_shards, tmp_path / "seed", registry)
    capsys.readouterr()
    v1 = json.loads((registry / "versions" / "v1" / "version.json").read_text())
    assert json.loads((registry / "champion.json").read_text())["version"] == "v1"

    temporary = tmp_path / "tmp"  # the run's TMPDIR: the steps' temporary folders are removed with the run
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    monkeypatch.setattr(tempfile, "tempdir", None)
    summary_file = tmp_path / "summary.json"
    code = main(["run", "--local", "--images", str(demo_dir / "images"), "--annotations",
                 str(demo_dir / "annotations"), "--time-budget", "15s", "--tune-trials", "0", "--batch-size", "8", "--image-size", "96",
                 "--promote-if", "better", "--pipeline-root", str(tmp_path / "root"), "--export-formats",
                 "saved_model,tflite", "--summary-json", str(summary_file)])
    assert code == 0
    assert list(temporary.iterdir()) == []
    out = capsys.readouterr().out
    assert "detpipe run summary" in out and "mAP@[.5:.95]" in out
    assert "per class (AP@[.5:.95] / AP50): " in out and "circle" in out.split("per class", 1)[1]
    # Quiet: one line per step and the summary; no ANSI codes when stdout is not a terminal.
    assert len(out.strip().splitlines()) <= 27 and "\x1b[" not in out
    assert "✓ validate-and-convert" in out and "64 written" in out and "✓ register" in out and "✓ review" in out
    assert "defaults (tune_trials 0)" in out  # the tune step says why, in its line
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
    probe_report = (run_dir / "probe" / "report").read_text()
    assert probe_report.startswith("# Environment probe")
    # The probe step's dry run: the real training's code for 2 steps on the run's data, under the
    # precision the probe recommends, then the checkpoint, weight average and export.
    dry_run = json.loads((run_dir / "probe" / "probe_json").read_text())["dry_run"]
    assert dry_run["passed"] and dry_run["decisions"]["xla"].startswith("off (auto)")
    assert "2 steps of 2 images at 96 px; precision float32: auto: no GPU" in dry_run["what"]
    assert "then a checkpoint, the weight average, model.keras and the SavedModel export" in dry_run["what"]
    assert "| dry_run | PASS | the real training ran here" in probe_report
    assert (run_dir / "train" / "model" / "model.keras").stat().st_size > 0
    hparams = json.loads((run_dir / "tune-hyperparameters" / "hparams" / "best_hparams.json").read_text())
    assert hparams["trials"] == 0 and hparams["decision"].startswith("tune_trials 0")  # the defaults
    # (`auto` under a budget: choose_search's examples; the dirty run searches with trials given)
    train_config = json.loads((run_dir / "train" / "model" / "train_config.json").read_text())
    assert train_config["train"]["base_lr_per_64"] == hparams["base_lr_per_64"]
    metrics = json.loads((run_dir / "evaluate" / "metrics_json").read_text())
    assert math.isfinite(metrics["metrics"]["mAP"]) and math.isfinite(metrics["metrics"]["AP50"])
    assert summary["metrics"]["mAP"] == metrics["metrics"]["mAP"]
    # What Vertex AI's console draws and links, written by the local runner too: the confusion
    # matrix (every class and background), and the register step's Vertex resources, none here.
    outputs = json.loads((run_dir / "evaluate" / "executor_output.json").read_text())["artifacts"]
    drawn = outputs["confusion_matrix"]["artifacts"][0]["metadata"]["confusionMatrix"]
    names = [spec["displayName"] for spec in drawn["annotationSpecs"]]
    assert names[:-1] == [k[3:] for k in metrics["metrics"] if k.startswith("AP/")] and names[-1] == "background"
    assert all(len(row["row"]) == len(names) for row in drawn["rows"]) and len(drawn["rows"]) == len(names)
    registered = json.loads((run_dir / "register" / "executor_output.json").read_text())["artifacts"]
    assert {name: a["artifacts"][0]["metadata"] for name, a in registered.items()} == {
        "uploaded_model": {"resourceName": ""}, "serving_endpoint": {"resourceName": ""}}
    saved_model = run_dir / "export" / "saved_model"
    assert (saved_model / "saved_model.pb").exists() and summary["saved_model"] == str(saved_model)
    serving = json.loads((saved_model / "serving_config.json").read_text())
    assert serving["score_threshold"] == metrics["threshold"]["score"] and serving["input_name"] == "image_bytes"

    # Each step's full output is kept.
    assert "cls_logits_loss" in (run_dir / "logs" / "train.log").read_text()  # Keras progress
    assert re.search(r"checked 64 records on worker \d+ \(64 in the job\)",
                     (run_dir / "logs" / "validate-and-convert.log").read_text())

    # One self-contained page about the run, at the top of the run folder.
    report = (run_dir / "run_report.html").read_text()
    assert summary["report"] == str(run_dir / "run_report.html") and 'id="champion"' in report
    assert "https://" not in report and "http://" not in report and report.count("data:image/png;base64,") >= 8
    dataset_page = (run_dir / "validate-and-convert" / "stats_html").read_text()
    assert 'id="dataset"' in dataset_page and "https://" not in dataset_page

    # The run warm-starts from v1 (its weights are kept with the version) and re-scores v1 on
    # the same val images; under `better` a tie is not enough.
    assert summary["version"] == "v2" and summary["started"].startswith("from v1 (the champion): the same tiny")
    # The same files as v1's: the run says so first (the local runner has no cache), and in its summary.
    assert summary["unchanged"].startswith("unchanged data: the same files as v1 ")
    assert "(better)" in summary["comparison"]
    assert summary["comparison"].startswith("champion v1 mAP") and f"same {metrics['num_images']} val images" \
        in summary["comparison"]
    first = next(line for line in out.splitlines() if "✓" in line or "✗" in line)
    assert "fingerprint-source" in first and "champion v1; unchanged data (v1's files)" in first
    assert "  " + summary["unchanged"] in out
    train_line = next((line for line in out.splitlines() if "✓ train" in line), out)
    assert train_line.endswith("images/s, 1 epoch: budget, from v1") and "registry: v2: champion v1" in out
    training = next(line for line in out.splitlines() if line.strip().startswith("training:"))
    # The default length, a time budget (here one that buys a single epoch of the warm start), shared
    # with the tune step, watched on held-out train images; the summary says what it became and why it ended.
    assert "; 1 epoch (" in training and "stopped: budget: " in training
    history = json.loads((run_dir / "train" / "model" / "history.json").read_text())
    assert len([v for v in history["held_out_mAP"] if v is not None]) == 1
    # A carve of 20% would pay for a refit on the whole split, but the budget is spent: the reason says so.
    decisions = json.loads((run_dir / "train" / "model" / "train_config.json").read_text())["result"]["decisions"]
    assert decisions["refit"].startswith("off: the budget has ") and "refit" not in training
    decision = json.loads((registry / "versions" / "v2" / "decision.json").read_text())
    assert decision["champion"]["version"] == "v1" and decision["rule"]["promote_if"] == "better"
    assert decision["rule"]["resamples"] >= 1000 and len(decision["val"]["fingerprint"]) == 64
    assert decision["warm_start"]["used"] and decision["warm_start"]["name"] == "v1 (the champion)"
    v2 = json.loads((registry / "versions" / "v2" / "version.json").read_text())
    assert v2["status"] == ("blessed" if decision["blessed"] else "rejected") and v2["run_id"] == run_dir.name
    assert json.loads((registry / "champion.json").read_text())["version"] == ("v2" if decision["blessed"] else "v1")
    for name in ("model.keras", "train_config.json"):  # the weights a later run continues, kept with v2
        assert (registry / "versions" / "v2" / name).read_bytes() == (run_dir / "train" / "model" / name).read_bytes()
    # Same source files: same fingerprint.
    assert v2["fingerprint"]["sha256"] == v1["fingerprint"]["sha256"] and len(v1["fingerprint"]["sha256"]) == 64
    # export_formats: the TFLite file re-scored beside the SavedModel, and kept with v2 when it passed.
    assert "✓ export" in out and "tflite passed" in out.split("✓ export", 1)[1].splitlines()[0]
    assert "converted files: tflite passed (export_report.md beside the model)" in out
    assert v2["files"] == {"tflite": "model.tflite"} and v1["files"] == {}
    assert (registry / "versions" / "v2" / "saved_model" / "model.tflite").stat().st_size > 0
    assert '<h2 id="files">Converted files</h2>' in report and "<td>tflite</td>" in report


def test_the_split_a_dataset_comes_with_reaches_the_data_step_and_a_failing_step_ends_with_its_reason_and_log(
        demo_dir, tmp_path, capsys):
    """`--val-annotations` and `--val-images` reach the fingerprint and the data step: the val
    XMLs' images are read from --val-images (corrupt copies here), so the val split is empty
    and the data step fails on it, where the hash split of --images would have passed. The run
    exits 1 without a traceback; the reason and the step log's path are in its last lines."""
    train, val, val_images = tmp_path / "train_xml", tmp_path / "val_xml", tmp_path / "val_images"
    for folder in (train, val, val_images):
        folder.mkdir()
    for n, xml in enumerate(sorted((demo_dir / "annotations").glob("*.xml"))):
        shutil.copyfile(xml, (val if n % 4 == 0 else train) / xml.name)
        if n % 4 == 0:
            image = demo_dir / "images" / f"{xml.stem}.jpg"
            (val_images / image.name).write_bytes(image.read_bytes()[:300])
    code = main(["run", "--local", "--images", str(demo_dir / "images"), "--annotations", str(train),
                 "--val-annotations", str(val), "--val-images", str(val_images),
                 "--max-reject-fraction", "1", "--pipeline-root", str(tmp_path / "root")])
    captured = capsys.readouterr()
    assert code == 1 and "✗ validate-and-convert" in captured.out and "Traceback" not in captured.err + captured.out
    assert any("(split val) | no examples" in line for line in captured.err.splitlines()[-8:]), captured.err
    log = captured.err.strip().splitlines()[-1].split("full log: ", 1)[1]
    assert log.endswith("validate-and-convert.log") and "RuntimeError: dataset anomalies" in open(log).read()
    (source,) = (tmp_path / "root").glob("*/fingerprint-source/source")
    assert json.loads(source.read_text())["val_images_path"] == str(val_images)
