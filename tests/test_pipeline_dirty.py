"""The real DAG on dirty real photos (raccoon with a record of every fault), with the KFP local
runner. A file of its own, apart from the demo's end-to-end run in test_pipeline_local.py: the
suite runs a file's tests on one worker (`--dist loadfile`), and these are the two longest."""

import json
import math
import re

import pytest
import tensorflow as tf
from dirty_data import make_dirty_copy, split_of

from beam.contract import feature_keys as K
from beam.contract.codec import decode_example
from beam.contract.files import read_manifest, read_rejects
from components.tune.hparams_file import DEFAULTS, SEARCH_SPACE
from pipeline.cli import main


GREYSCALE = ("raccoon-150", "raccoon-152", "raccoon-161")  # raccoon's photos that are not RGB


@pytest.fixture(scope="module")
def dirty_raccoon(raccoon, tmp_path_factory):
    """Raccoon plus a record of every fault the DAG's data step can meet (truncated JPEG,
    missing image, unparseable XML, bad boxes beside good ones, a duplicate id, a size
    mismatch, an icon file, no class name, an image the split file leaves out) and awkward
    images it must accept (alpha PNG, greyscale PNG, a GIF, an EXIF-rotated photo), and what a
    hostile export holds (a class and a file named as markup, two photos named outside the folder).
    Half of raccoon's photos (the even numbers and the 3 greyscale ones: 101), for the suite's
    time: the DAG on all 200 is a person's run before a change lands (`detpipe run --local
    --images tests/data/raccoon/images --annotations tests/data/raccoon/annotations`)."""
    def half(stem: str) -> bool:
        return int(stem.rsplit("-", 1)[-1]) % 2 == 0 or stem in GREYSCALE

    return make_dirty_copy(raccoon / "images", raccoon / "annotations", tmp_path_factory.mktemp("dirty_raccoon"),
                           split_file=True, hostile=True, keep=half)


@pytest.mark.slow
def test_run_local_on_dirty_real_photos_with_a_split_file_and_tuning(dirty_raccoon, tmp_path, capsys):
    """The real-data path: 101 raccoon photos (non-square, 178-2000 px, 3 greyscale, one
    class) made dirty, the user's own split (val not a multiple of any batch), a short
    schedule and a 2-trial search (its trials at once, in two worker processes sharing the
    study's journal), through the real DAG with the KFP local runner: the run is green, the
    report shows every reject, and counts reconcile."""
    dirty = dirty_raccoon
    summary_file = tmp_path / "summary.json"
    code = main(["run", "--local", "--images", str(dirty.images), "--annotations", str(dirty.annotations),
                 "--split-file", str(dirty.split_file), "--epochs", "2", "--batch-size", "8", "--tune-trials", "2",
                 "--tune-trial-epochs", "1", "--tune-parallel-trials", "2", "--pipeline-root", str(tmp_path / "root"),
                 "--no-probe-dry-run",  # the demo's run (test_pipeline_local.py) proves the dry run
                 "--summary-json", str(summary_file)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert re.search(r"✓ tune-hyperparameters .* 2 trials \(\d+\.\dx\): [+-]\d\.\d{3} vs defaults", out), out
    summary = json.loads(summary_file.read_text())
    run_dir = tmp_path / "root" / summary["run_dir"].rsplit("/", 1)[-1]

    dataset = run_dir / "validate-and-convert" / "dataset"
    manifest = read_manifest(str(dataset))
    sources = len(list(dirty.annotations.glob("*.xml")))
    assert manifest.records_in == sources == manifest.written_total + manifest.rejected
    assert manifest.reconcile_problems() == []
    # Raccoon's 3 greyscale photos and the dirty set's grey and alpha PNGs; every written image is counted.
    assert manifest.color_modes["L"] == 4 and manifest.color_modes["RGBA"] == 1
    assert sum(manifest.color_modes.values()) == manifest.written_total and manifest.exif_orientation["applied"] == 1
    assert manifest.converted_formats == {"GIF": 1}
    rejects = read_rejects(str(dataset))
    assert {r.reason for r in rejects if not r.is_box} == set(dirty.image_rejects.values())
    assert {(r.image_id, r.box_index): r.reason for r in rejects if r.is_box} == dirty.box_rejects
    assert summary["rejected"] == manifest.rejected and summary["boxes_dropped"] == len(dirty.box_rejects)
    assert f"{len(dirty.box_rejects)} bad box(es) dropped" in out
    written = manifest.written
    assert written["val"] % 8 != 0
    listed, boxes_of = split_of(dirty), {}
    for split in ("train", "val"):
        files = sorted(str(p) for p in dataset.glob(f"{split}-*.tfrecord"))
        examples = [decode_example(r.numpy()) for r in tf.data.TFRecordDataset(files)]
        ids = [ex[K.SOURCE_ID][0].decode() for ex in examples]
        assert len(ids) == written[split] and all(listed[i] == split for i in ids)  # the user's split
        boxes_of.update({i: len(ex[K.XMIN]) for i, ex in zip(ids, examples)})
        assert sum(len(ex[K.XMIN]) for ex in examples) == manifest.boxes[split].written
    # Images with dropped boxes are written with the others (none left: a negative).
    assert {i: boxes_of[i] for i in dirty.kept_boxes} == dirty.kept_boxes
    assert set(json.loads((dataset / "label_map.json").read_text())) == {"raccoon", dirty.hostile_class}

    # The page a user opens lists every reason with its examples, and how the split file matched.
    report = (run_dir / "run_report.html").read_text()
    assert manifest.split_file["unknown"] == 0 and (
        f"Split file: {manifest.split_file['matched']} of its {manifest.split_file['listed']} ids") in report
    for reason in dirty.reasons:
        assert f"<td>{reason}</td>" in report, reason
    for image_id in {r.image_id for r in rejects}:
        assert f"<code>{image_id}</code>" in report

    trials = [json.loads(line) for line in
              (run_dir / "tune-hyperparameters" / "hparams" / "trials.jsonl").read_text().splitlines()]
    assert len(trials) == 2 and all(t["error"] is None and math.isfinite(t["score"]) for t in trials)
    assert {t["state"] for t in trials} <= {"COMPLETE", "PRUNED"} and trials[0]["state"] == "COMPLETE"
    # In parallel: each trial ran once, the defaults first, the other with values of the search space.
    assert "2 trials at once, one process each" in (run_dir / "logs" / "tune-hyperparameters.log").read_text()
    assert sorted(t["number"] for t in trials) == [0, 1] and trials[0]["hparams"] == DEFAULTS
    assert trials[1]["hparams"] != DEFAULTS and set(trials[1]["hparams"]) == set(SEARCH_SPACE)
    chosen = json.loads((run_dir / "tune-hyperparameters" / "hparams" / "best_hparams.json").read_text())
    held = chosen["search"]["tuning_split"]  # scored on train images held out, never on val
    assert held["fit"] + held["held_out"] == written["train"] and held["held_out"] > 0

    model = run_dir / "train" / "model"
    train_config = json.loads((model / "train_config.json").read_text())
    assert train_config["result"]["num_train"] == written["train"]
    assert train_config["result"]["steps"] == 2 * (written["train"] // 8)
    losses = json.loads((model / "history.json").read_text())["loss"]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]

    metrics = json.loads((run_dir / "evaluate" / "metrics_json").read_text())
    assert metrics["num_images"] == written["val"]

    # The first run on an empty registry: from scratch; v1 is blessed only when it beats the
    # box-prior baseline on the same val images, and recorded either way, with the weights a
    # later run continues. (A run with a champion: test_pipeline_local.py.)
    assert summary["started"].startswith("from scratch: no champion in ") and summary["unchanged"] == ""
    registry = tmp_path / "root" / "registry" / "detpipe"
    first = json.loads((registry / "versions" / "v1" / "decision.json").read_text())
    assert summary["version"] == "v1" and first["champion"] is None
    assert first["baseline"]["mAP"] >= 0 and "train box" in first["baseline"]["description"]
    assert first["blessed"] == (metrics["metrics"]["mAP"] > first["baseline"]["mAP"])
    if first["blessed"]:
        assert "no champion yet" in summary["comparison"]
        assert json.loads((registry / "champion.json").read_text())["version"] == "v1"
    else:
        assert "does not beat the box-prior baseline" in summary["comparison"]
        assert not (registry / "champion.json").exists()
    v1 = json.loads((registry / "versions" / "v1" / "version.json").read_text())
    assert v1["run_id"] == run_dir.name and len(v1["fingerprint"]["sha256"]) == 64 and v1["files"] == {}
    assert (registry / "versions" / "v1" / "saved_model" / "saved_model.pb").exists()
    for name in ("model.keras", "train_config.json"):
        assert (registry / "versions" / "v1" / name).read_bytes() == (model / name).read_bytes()
    # The dry run turned off: the probe warns, and says how to turn it on.
    assert "| dry_run | WARN | not run (probe_dry_run false)" in (run_dir / "probe" / "report").read_text()
    assert json.loads((run_dir / "probe" / "probe_json").read_text())["dry_run"] is None
    assert "AP/raccoon" in metrics["metrics"]
    assert all(math.isfinite(v) for v in metrics["metrics"].values())
    assert summary["metrics"]["mAP"] == metrics["metrics"]["mAP"]

    # The label review of the val split, from evaluation's detections (no second prediction pass):
    # the list for a labelling tool, the page beside the run report, the line in the summary.
    # A model of 2 epochs is under the review's floor: nothing it found is flagged, and the line says why.
    from components.review.label_review import ReviewSummary, read_review, summary_line, summary_sentence

    issues = read_review(run_dir / "review" / "label_review" / "label_review.jsonl")
    concluded = ReviewSummary.read(run_dir / "review" / "label_review")
    assert all(i.flagged for i in issues) and summary["review"] == summary_line(issues, concluded.weak)
    assert concluded.summary == summary["review"] and concluded.flagged == len(issues)
    assert f"label review: {summary_line(issues, concluded.weak)}, see {run_dir / 'label_review.html'}" in out
    page = (run_dir / "label_review.html").read_text()
    assert page == (run_dir / "review" / "review_page").read_text()
    assert page.count("<figure>") == min(len(issues), 200) and f"{written['val']} val images reviewed" in page
    val_ids = {i for i, split in listed.items() if split == "val"}
    assert all(i.image in val_ids and 0 <= i.box[0] <= i.box[2] <= i.width for i in issues)
    assert 'id="review"' in report and summary_sentence(issues, concluded.weak) in report

    # Nothing a stranger's dataset says is markup on any page or report the run wrote, and the
    # console shows a right-to-left override as text.
    def is_page(path) -> bool:  # a page or report by its name, or a KFP HTML/Markdown artifact by its start
        head = path.read_bytes()[:64].lower() if path.suffix == "" else b""
        return path.suffix in (".html", ".md") or head.startswith((b"<!doctype", b"<html", b"# "))

    pages = [p for p in run_dir.rglob("*") if p.is_file() and is_page(p)]
    assert any(p.name == "run_report.html" for p in pages) and any(p.suffix == ".md" for p in pages)
    for page_file in pages:
        text = page_file.read_text(errors="replace")
        for raw in ("<script>alert", "<img src=x onerror", "\u202e"):
            assert raw not in text, (page_file, raw)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\u202eredro" in report
    assert "\u202e" not in out
    # The two photos named outside the images folder: rejected with their paths, never read.
    outside = {r.image_id: r.message for r in rejects if r.reason == "image_outside_folder"}
    assert sorted(outside) == ["dirty-absolute", "dirty-climbs"] and "'../outside/dirty-climbs.jpg'" in outside[
        "dirty-climbs"]
