"""The label review (components/review/label_review.py) on raccoon's real boxes: planted
label errors (removed, relabelled, shifted boxes) are found near the top and untouched labels
are rarely flagged. The detections are a stand-in for a good detector's, made from the clean
labels (each object found at IoU ~0.8 with a high score, a faint guess of the other class,
scattered low-score false positives), so the test measures the review, not a model's training."""

from dataclasses import replace

import numpy as np
import pytest

from components.detector.coco_metrics import ImageDetections, ImageTruth
from components.review.label_review import (DUPLICATE, MISPLACED, MISSING, WRONG_CLASS, Evidence, LabelIssue,
                                              read_review, review_labels, summary_line, summary_sentence, write_review)

PLANTED = 5  # of each kind: removed, relabelled, shifted, drawn twice
KINDS = (MISSING, WRONG_CLASS, MISPLACED, DUPLICATE)
NAMES = {1: "raccoon", 2: "dog"}


@pytest.fixture(scope="module")
def raccoon_truths(raccoon_shards):
    import tensorflow as tf

    from components.detector.records import parse_boxes, shard_files

    truths, images = [], {}
    for i, record in enumerate(tf.data.TFRecordDataset(shard_files(str(raccoon_shards), "train"))):
        example = parse_boxes(record, encoded=True)
        truths.append(ImageTruth(i + 1, int(example["height"]), int(example["width"]),
                                 [tuple(map(float, b)) for b in example["boxes"].numpy()],
                                 [int(c) for c in example["labels"].numpy()], name=f"raccoon-{i}"))
        images[truths[-1].name] = example["encoded"].numpy()
    return truths, images


def _detector(truths: list[ImageTruth], seed: int = 0) -> list[ImageDetections]:
    rng = np.random.default_rng(seed)
    out = []
    for truth in truths:
        boxes, scores, labels = [], [], []
        for box, label in zip(truth.boxes, truth.labels):
            ymin, xmin, ymax, xmax = box
            h, w = ymax - ymin, xmax - xmin
            jitter = rng.normal(0, 0.04, 4) * [h, w, h, w]
            boxes.append(tuple(np.clip(np.add(box, jitter), 0, 1)))
            scores.append(float(rng.uniform(0.8, 0.99)))
            labels.append(label)
            boxes.append(boxes[-1])  # the faint second guess a detector makes on the same object
            scores.append(float(rng.uniform(0.02, 0.1)))
            labels.append(3 - label)
        for _ in range(rng.integers(0, 3)):  # background the model half believes in
            y, x = rng.uniform(0, 0.8, 2)
            boxes.append((y, x, y + 0.15, x + 0.15))
            scores.append(float(rng.uniform(0.05, 0.3)))
            labels.append(int(rng.integers(1, 3)))
        out.append(ImageDetections(truth.image_id, boxes, scores, labels))
    return out


def _iou_yxyx(a, b) -> float:
    lo, hi = np.maximum(a[:2], b[:2]), np.minimum(a[2:], b[2:])
    inter = float(np.prod(np.maximum(np.subtract(hi, lo), 0)))
    return inter / (np.prod(np.subtract(a[2:], a[:2])) + np.prod(np.subtract(b[2:], b[:2])) - inter)


def _points_at(issue, truth, index, kind) -> bool:
    """Whether `issue` points at label `index` of `truth` (or, for a removed box, at its place)."""
    if issue.image != truth.name or issue.kind != kind:
        return False
    if kind != MISSING:
        return issue.label_index == index
    ymin, xmin, ymax, xmax = truth.boxes[index]
    want = np.array([xmin * truth.width, ymin * truth.height, xmax * truth.width, ymax * truth.height])
    got = np.array(issue.box)
    lo, hi = np.maximum(want[:2], got[:2]), np.minimum(want[2:], got[2:])
    inter = np.prod(np.maximum(hi - lo, 0))
    return inter / (np.prod(want[2:] - want[:2]) + np.prod(got[2:] - got[:2]) - inter) >= 0.5


def _plant(truths, rng):
    planted, dirty = [], list(truths)
    for n, i in enumerate(rng.choice(len(truths), size=len(KINDS) * PLANTED, replace=False)):
        truth = truths[i]
        j = int(rng.integers(len(truth.boxes)))
        kind = KINDS[n // PLANTED]
        boxes, labels = list(truth.boxes), list(truth.labels)
        if kind == DUPLICATE:  # drawn again, a few pixels off: the copy is the last label
            boxes.append(tuple(float(v) for v in np.clip(np.add(boxes[j], rng.normal(0, 0.005, 4)), 0, 1)))
            labels.append(labels[j])
            j = len(boxes) - 1
        elif kind == MISSING:  # the label removed: the raccoon is now unlabelled
            del boxes[j], labels[j]
        elif kind == WRONG_CLASS:
            labels[j] = 3 - labels[j]
        else:  # shifted by half its width and height, towards the middle of the photo
            ymin, xmin, ymax, xmax = boxes[j]
            dy, dx = 0.5 * (ymax - ymin), 0.5 * (xmax - xmin)
            dy, dx = (dy if ymin + ymax < 1 else -dy), (dx if xmin + xmax < 1 else -dx)
            boxes[j] = (max(ymin + dy, 0), max(xmin + dx, 0), min(ymax + dy, 1), min(xmax + dx, 1))
        dirty[i] = replace(truth, boxes=boxes, labels=labels)
        planted.append((truth, j, kind))
    return planted, dirty


def test_planted_label_errors_are_found_near_the_top_and_untouched_labels_rarely_flagged(raccoon_truths, tmp_path):
    raccoon_truths, images = raccoon_truths
    detections = _detector(raccoon_truths)
    planted, dirty = _plant(raccoon_truths, np.random.default_rng(1))
    issues = review_labels(dirty, detections, NAMES)
    top = issues[:2 * len(planted)]
    found = {kind: sum(any(_points_at(issue, t, j, k) for issue in top) for t, j, k in planted if k == kind)
             for kind in KINDS}
    untouched = sum(len(t.boxes) for t in raccoon_truths) - len(planted)
    other_flags = [i for i in issues if i.flagged and not any(_points_at(i, *p) for p in planted)]
    print(f"found in the top {len(top)}: {found} of {PLANTED} each; {len(other_flags)} other flags over "
          f"{untouched} untouched labels; {summary_line(issues)}")
    assert sum(found.values()) >= 0.8 * len(planted) and min(found.values()) >= PLANTED - 2
    assert len(other_flags) <= 0.02 * untouched
    # The clean labels: hardly anything flagged.
    assert sum(i.flagged for i in review_labels(raccoon_truths, detections, NAMES)) <= 0.02 * untouched
    # What a labelling tool imports: the flagged issues, best first, boxes in the photo's pixels.
    lines = write_review(issues, tmp_path / "label_review.jsonl").read_text().splitlines()
    assert len(lines) == sum(i.flagged for i in issues) > 0
    assert read_review(tmp_path / "label_review.jsonl") == [i for i in issues if i.flagged]
    import json

    first = json.loads(lines[0])
    assert first["image"].startswith("raccoon-") and first["kind"] in KINDS
    assert 0 <= first["box"][0] < first["box"][2] <= first["width"]
    # What people look at: a crop of each flagged issue, in the ranked order, embedded.
    from components.review.review_page import write_review_page

    page = write_review_page(issues, images, tmp_path / "label_review.html", "raccoon reviewed").read_text()
    assert page.count("<figure>") == len(lines) and page.count("data:image/png;base64,") == len(lines)
    assert page.index(f"<code>{first['image']}</code>") < page.rindex("<code>") or len(lines) == 1
    assert summary_sentence(issues) in page


def test_the_review_page_shows_hostile_class_and_file_names_as_text(tmp_path):
    """Names come from strangers' datasets: a class and a photo named as markup are escaped on the page."""
    import io

    from PIL import Image

    from components.review.review_page import write_review_page

    buffer = io.BytesIO()
    Image.new("RGB", (40, 40)).save(buffer, format="PNG")
    hostile = LabelIssue(image='"><img src=x onerror=alert(3)>.png', kind=MISPLACED, box=(2.0, 2.0, 20.0, 20.0),
                         class_name="<script>alert(1)</script>", score=0.1, flagged=True, label_index=0,
                         evidence=None, width=40, height=40)
    page = write_review_page([hostile], {hostile.image: buffer.getvalue()}, tmp_path / "page.html", "r").read_text()
    assert "<script>alert(1)</script>" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and page.count("data:image/png;base64,") == 1


def test_a_review_with_nothing_predicted_flags_nothing():
    truth = ImageTruth(1, 50, 50, [(0.1, 0.1, 0.5, 0.5)], [1], name="x")
    assert review_labels([truth], [ImageDetections(1, [], [], [])], {1: "a"}) == []
    # ... but a box drawn twice is a duplicate, predictions or not; the copy is flagged, the original kept.
    twice = replace(truth, boxes=[truth.boxes[0], (0.11, 0.1, 0.5, 0.5), (0.6, 0.6, 0.9, 0.9)], labels=[1, 1, 1])
    [issue] = review_labels([twice], [ImageDetections(1, [], [], [])], {1: "a"})
    assert (issue.kind, issue.label_index, issue.flagged, issue.repeats) == (DUPLICATE, 1, True, (5.0, 5.0, 25.0, 25.0))
    assert summary_sentence([replace(issue, class_name="RBC")]) == "1 likely label problem: 1 duplicate RBC box"
    assert summary_sentence([]) == "No likely label problems"
    with pytest.raises(ValueError, match="1 images of labels but 0"):
        review_labels([truth], [], {1: "a"})


def test_review_command_writes_the_list_and_the_page(raccoon_model, raccoon_shards, tmp_path, capsys):
    from pipeline.cli import main

    out = tmp_path / "review"
    assert main(["review", "--model", str(raccoon_model), "--data", str(raccoon_shards), "--output", str(out),
                 "--confident", "0.01", "--floor", "0"]) == 0  # a model of 3 steps: judged anyway
    printed = capsys.readouterr().out
    assert "43 val images reviewed:" in printed and "label_review.html" in printed
    page = (out / "label_review.html").read_text()
    lines = (out / "label_review.jsonl").read_text().splitlines()
    assert page.startswith("<!doctype html>") and page.count("<figure>") == min(len(lines), 200)

    # With the evaluation of the model on this data: its detections are reviewed, no second
    # prediction pass, and the list is the one the review's own prediction gave.
    from components.evaluate.detections_file import read_detections, write_detections

    evaluation = tmp_path / "evaluation"
    assert main(["evaluate", "--model", str(raccoon_model), "--data", str(raccoon_shards), "--output",
                 str(evaluation)]) == 0
    again = tmp_path / "again"
    assert main(["review", "--model", str(raccoon_model), "--data", str(raccoon_shards), "--output", str(again),
                 "--confident", "0.01", "--evaluation", str(evaluation), "--floor", "0"]) == 0
    first, second = read_review(out / "label_review.jsonl"), read_review(again / "label_review.jsonl")
    assert [(i.image, i.kind, i.label_index, i.box) for i in first] == \
        [(i.image, i.kind, i.label_index, i.box) for i in second]
    assert np.allclose([i.score for i in first], [i.score for i in second], atol=1e-4)
    # What the review reads is the evaluation's file: a 3-step model finds little, so a good
    # detector's answer is put there, with a confident raccoon in the first photo nobody boxed.
    truths, _ = read_detections(evaluation / "val_detections.jsonl")
    found = _detector(truths)
    found[0].boxes.append((0.0, 0.0, 0.02, 0.02))
    found[0].scores.append(0.97)
    found[0].labels.append(1)
    assert not any(_iou_yxyx((0.0, 0.0, 0.02, 0.02), box) > 0 for box in truths[0].boxes)
    write_detections(truths, found, evaluation / "val_detections.jsonl")
    assert main(["review", "--model", str(raccoon_model), "--data", str(raccoon_shards), "--output", str(again),
                 "--evaluation", str(evaluation)]) == 0
    top = read_review(again / "label_review.jsonl")[0]
    assert (top.image, top.kind, top.evidence.score) == (truths[0].name, MISSING, 0.97)
    assert (again / "label_review.html").read_text().count("<figure>") >= 1
    # An evaluation of other data is refused, in one line.
    lines = (evaluation / "val_detections.jsonl").read_text().splitlines()
    (evaluation / "val_detections.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    capsys.readouterr()
    assert main(["review", "--model", str(raccoon_model), "--data", str(raccoon_shards), "--output", str(again),
                 "--evaluation", str(evaluation)]) != 0
    [line] = capsys.readouterr().err.strip().splitlines()[-1:]
    assert "evaluated 42 val images but the data has 43: review the data that evaluation used" in line


def test_a_misplaced_box_is_shown_with_the_confident_prediction_that_disagrees():
    """The evidence is the prediction cleanlab weighs (score >= confident), not a faint one that
    happens to overlap the label more."""
    truth = ImageTruth(1, 100, 100, [(0.1, 0.1, 0.4, 0.4)], [1], name="x")
    found = ImageDetections(1, [(0.12, 0.1, 0.42, 0.4), (0.25, 0.25, 0.55, 0.55)], [0.06, 0.9], [1, 1])
    [issue] = [i for i in review_labels([truth], [found], {1: "a"}) if i.kind == MISPLACED]
    assert issue.evidence == Evidence((25.0, 25.0, 55.0, 55.0), "a", 0.9)


@pytest.mark.slow  # trains a model: `make test` runs it, `make test-fast` not
def test_review_folds_predict_every_train_image_once_with_a_model_that_did_not_see_it(raccoon_model, raccoon_shards,
                                                                                       tmp_path):
    import tensorflow as tf

    from components.detector.records import count_records, read_records, shard_files
    from components.review.fold_review import fold_of, fold_train_config, predict_folds, write_fold

    train = [r.numpy() for r in read_records(shard_files(str(raccoon_shards), "train"), deterministic=True)]
    # Fold k's val is the train records of fold k, its train every other one: disjoint, all of them.
    folder = tmp_path / "fold"
    held_out = write_fold(str(raccoon_shards), 3, 1, folder)
    fold_records = {split: {r.numpy() for r in tf.data.TFRecordDataset(shard_files(str(folder), split))}
                    for split in ("train", "val")}
    assert held_out == len(fold_records["val"]) == sum(fold_of(r, 3) == 1 for r in train) > 0
    assert fold_records["val"] | fold_records["train"] == set(train) and not fold_records["val"] & fold_records["train"]
    # The fold models: the reviewed model's options, from scratch (a warm start would have seen the fold).
    config = fold_train_config(str(raccoon_model), str(folder), str(tmp_path / "m"))
    assert (config.image_size, config.max_steps, config.init_from, config.data_dir) == (64, 3, None, str(folder))

    truths, detections, images = predict_folds(str(raccoon_model), str(raccoon_shards), 2, tmp_path / "folds")
    assert len(truths) == len(detections) == len(images) == count_records(str(raccoon_shards), "train")
    assert len({t.name for t in truths}) == len(truths) and [t.image_id for t in truths] == list(range(1, len(truths) + 1))
    assert not (tmp_path / "folds").exists() or not any((tmp_path / "folds").iterdir())  # each fold removed


def test_review_folds_must_leave_a_fold_to_train_on(raccoon_model, raccoon_shards, tmp_path, capsys):
    from pipeline.cli import main

    with pytest.raises(SystemExit):
        main(["review", "--model", str(raccoon_model), "--data", str(raccoon_shards), "--output", str(tmp_path),
              "--review-folds", "1"])
    assert "at least 2: one fold leaves no other fold to train on" in capsys.readouterr().err
    from components.review.fold_review import fold_cost

    assert fold_cost(str(raccoon_model), 5, 2).startswith("5 models of 2 epochs, each on 4/5 of the 157 train images: "
                                                          "1256 images trained, about ")


def test_a_prediction_that_spans_two_labelled_objects_does_not_flag_them_as_misplaced():
    """Two raccoons side by side, the model answers both with one box: cleanlab scores each label
    as badly located; the model merged them, so neither is flagged (both stay ranked)."""
    truth = ImageTruth(1, 100, 200, [(0.3, 0.05, 0.7, 0.3), (0.3, 0.7, 0.7, 0.95)], [1, 1], name="two")
    merged = ImageDetections(1, [(0.25, 0.03, 0.75, 0.97)], [0.9], [1])
    issues = [i for i in review_labels([truth], [merged], {1: "raccoon"}) if i.kind == MISPLACED]
    assert len(issues) == 2 and all(i.score <= 0.2 and not i.flagged for i in issues)
    # The same prediction around one label only: that label is flagged.
    alone = replace(truth, boxes=truth.boxes[:1], labels=[1])
    [issue] = [i for i in review_labels([alone], [merged], {1: "raccoon"}) if i.kind == MISPLACED]
    assert issue.score <= 0.2 and issue.flagged


def test_a_review_judged_by_a_model_under_the_floor_flags_nothing_and_says_why(raccoon_model, raccoon_shards,
                                                                              tmp_path, capsys):
    """A weak detector's answer on raccoon's val photos (it finds the raccoon in every other photo
    and believes in a box of background in each): what it disagrees with is its own error, not
    the labels'. Under REVIEW_FLOOR_AP50 none is flagged, and each place people read says why
    (the command's line, the page, the summary file the run report reads); judged anyway
    (`--floor 0`), its confident background boxes would be listed as missing labels."""
    from components.evaluate.detections_file import read_detections, write_detections
    from components.report.sections import review_section
    from components.review.label_review import REVIEW_FLOOR_AP50, ReviewSummary
    from pipeline.cli import main

    evaluation = tmp_path / "evaluation"
    assert main(["evaluate", "--model", str(raccoon_model), "--data", str(raccoon_shards), "--output",
                 str(evaluation)]) == 0
    truths, _ = read_detections(evaluation / "val_detections.jsonl")
    weak = []
    for index, found in enumerate(_detector(truths)):
        keep = [i for i in range(len(found.boxes)) if index % 2 == 0 or found.scores[i] < 0.5]
        weak.append(ImageDetections(found.image_id, [found.boxes[i] for i in keep] + [(0.0, 0.0, 0.1, 0.1)],
                                    [found.scores[i] for i in keep] + [0.9], [found.labels[i] for i in keep] + [1]))
    write_detections(truths, weak, evaluation / "val_detections.jsonl")
    capsys.readouterr()
    out = tmp_path / "weak"
    assert main(["review", "--model", str(raccoon_model), "--data", str(raccoon_shards), "--output", str(out),
                 "--evaluation", str(evaluation), "--confident", "0.5"]) == 0
    printed = capsys.readouterr().out
    assert "no label problems flagged: the model judging them is too weak: val AP50" in printed
    assert read_review(out / "label_review.jsonl") == []  # raccoon's labels hold no duplicate boxes
    summary = ReviewSummary.read(out)
    assert summary.flagged == 0 and summary.ap50 < REVIEW_FLOOR_AP50 and f"floor of {REVIEW_FLOOR_AP50:g}" in summary.weak
    assert "too weak" in (out / "label_review.html").read_text()
    assert review_section(out)["summary"].startswith("No label problems flagged: the model judging them is too weak")
    judged = tmp_path / "judged"
    assert main(["review", "--model", str(raccoon_model), "--data", str(raccoon_shards), "--output", str(judged),
                 "--evaluation", str(evaluation), "--confident", "0.5", "--floor", "0"]) == 0
    listed = read_review(judged / "label_review.jsonl")
    assert len([i for i in listed if i.kind == MISSING]) >= len(truths) // 2 and not ReviewSummary.read(judged).weak
