"""Evaluation pictures (PNGs beside eval_report.md): what the numbers mean.

- `pr_curves.png`: precision against recall per class at IoU 0.5 (COCO's matching);
- `f1_threshold.png`: F1, precision and recall against the score threshold, the chosen one marked;
- `confusion.png`: truth class against predicted class at that threshold, with a
  background row (false detections) and column (missed boxes);
- `ap_by_size.png`: AP@[.5:.95] for small, medium and large objects (COCO's areas);
- `gallery.png`: the val images with the most missed plus false boxes, truth in green and
  predictions in orange.

matplotlib with the Agg backend: no display needed.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from components.evaluate.bootstrap import match_table  # noqa: E402
from components.detector.coco_metrics import ImageDetections, ImageTruth  # noqa: E402
from components.evaluate.threshold import f1_curve, iou  # noqa: E402

PR_FILE, F1_FILE, CONFUSION_FILE, SIZE_FILE, GALLERY_FILE = (
    "pr_curves.png", "f1_threshold.png", "confusion.png", "ap_by_size.png", "gallery.png")
# The confusion matrix's counts beside its picture: {"labels": [class..., "background"],
# "matrix": rows of counts (truth) by columns (prediction), "threshold": score}. The pipeline's
# evaluate step hands them to Vertex AI as a system.ClassificationMetrics, which the console draws.
CONFUSION_DATA_FILE = "confusion.json"
TRUTH_COLOUR, PREDICTION_COLOUR = "#2ca02c", "#ff7f0e"


def _save(fig, path, dpi: int = 100) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def draw_pr_curves(truths: list[ImageTruth], detections: list[ImageDetections], names: dict[int, str], path) -> None:
    table = match_table(truths, detections, names)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for class_id, matches in zip(table.class_ids, table.classes):
        positives = int(matches.positives.sum())
        if positives == 0:
            continue
        tp, fp = np.cumsum(matches.tp[0]), np.cumsum(matches.fp[0])  # IoU 0.5
        recall = np.concatenate([[0.0], tp / positives])
        precision = np.concatenate([[1.0], tp / np.maximum(tp + fp, 1)])
        ax.plot(recall, precision, label=f"{names[class_id]} ({positives} boxes)")
    ax.set(xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02),
           title="Precision-recall per class at IoU 0.5")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(loc="lower left", fontsize=8)
    _save(fig, path)


def draw_f1_threshold(truths, detections, threshold: float, path) -> None:
    curve = f1_curve(truths, detections)
    fig, ax = plt.subplots(figsize=(6, 4))
    if curve is not None:
        ax.plot(curve.scores, curve.f1, label="F1", linewidth=2)
        ax.plot(curve.scores, curve.precision, label="precision", alpha=0.7)
        ax.plot(curve.scores, curve.recall, label="recall", alpha=0.7)
        ax.legend(fontsize=8)
    ax.axvline(threshold, color="black", linestyle="--")
    ax.annotate(f"chosen {threshold:.2f}", (threshold, 0.95), xytext=(4, 0), textcoords="offset points", fontsize=8)
    ax.set(xlabel="score threshold (keep detections at or above)", ylabel="value", xlim=(0, 1), ylim=(0, 1.02),
           title="F1 against the score threshold (IoU 0.5)")
    ax.grid(alpha=0.3)
    _save(fig, path)


@dataclass
class ImageErrors:
    image_id: int
    missed: int
    false: int


def confusion(truths, detections, names: dict[int, str], threshold: float,
              iou_threshold: float = 0.5) -> tuple[np.ndarray, list[ImageErrors]]:
    """Counts [truth class + background, predicted class + background] at `threshold`:
    each kept detection (highest score first) takes the unmatched truth box of any class it
    overlaps most (IoU >= 0.5); the last row holds false detections, the last column missed
    boxes. Difficult boxes count nowhere. Also the missed and false boxes per image.

    Not faster-coco-eval's `PreviewResults.compute_confusion_matrix` (1.8): it has no
    background row, counts difficult boxes as truth and, matching within a class (`useCats`,
    its default, which it warns about), never sees one class taken for another
    (tests/test_coco_crosscheck.py)."""
    ids = sorted(names)
    index = {c: i for i, c in enumerate(ids)}
    background = len(ids)
    matrix = np.zeros((background + 1, background + 1), dtype=np.int64)
    errors = []
    for truth, found in zip(truths, detections):
        boxes = np.asarray(truth.boxes, dtype=np.float64).reshape(-1, 4)
        difficult = np.asarray(truth.difficult or [0] * len(boxes), dtype=bool)
        # A class the model does not know (data with a new class) counts nowhere, as difficult boxes do.
        difficult = difficult | np.asarray([label not in index for label in truth.labels], dtype=bool)
        taken = np.zeros(len(boxes), dtype=bool)
        false = 0
        for j in np.argsort(-np.asarray(found.scores), kind="stable"):
            if found.scores[j] < threshold or found.labels[j] not in index:
                continue
            overlaps = np.where(~taken, iou(np.asarray(found.boxes[j]), boxes), -1.0) if len(boxes) else np.array([])
            best = int(np.argmax(overlaps)) if overlaps.size else -1
            if best >= 0 and overlaps[best] >= iou_threshold:
                taken[best] = True
                if not difficult[best]:
                    matrix[index[truth.labels[best]], index[found.labels[j]]] += 1
                    false += int(truth.labels[best] != found.labels[j])
            else:
                matrix[background, index[found.labels[j]]] += 1
                false += 1
        missed = 0
        for k in np.flatnonzero(~taken & ~difficult):
            if truth.labels[k] in index:
                matrix[index[truth.labels[k]], background] += 1
                missed += 1
        errors.append(ImageErrors(truth.image_id, missed, false))
    return matrix, errors


def confusion_labels(names: dict[int, str]) -> list[str]:
    """The rows and columns of `confusion`'s matrix: the classes by id, then background."""
    return [names[c] for c in sorted(names)] + ["background"]


def write_confusion(matrix: np.ndarray, names: dict[int, str], threshold: float, path) -> None:
    with open(path, "w") as handle:
        json.dump({"labels": confusion_labels(names), "matrix": matrix.tolist(), "threshold": float(threshold)},
                  handle)


def read_confusion(path) -> tuple[list[str], list[list[int]]]:
    """The labels and the matrix `write_confusion` wrote."""
    with open(path) as handle:
        found = json.load(handle)
    return found["labels"], found["matrix"]


def draw_confusion(matrix: np.ndarray, names: dict[int, str], threshold: float, path) -> None:
    labels = confusion_labels(names)
    size = 1.2 + 0.7 * len(labels)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    image = ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set(xlabel="predicted", ylabel="truth", title=f"Confusion at score >= {threshold:.2f}, IoU 0.5")
    peak = matrix.max() if matrix.size else 0
    for (i, j), value in np.ndenumerate(matrix):
        ax.text(j, i, str(value), ha="center", va="center", fontsize=8,
                color="white" if peak and value > peak / 2 else "black")
    fig.colorbar(image, ax=ax, fraction=0.046)
    _save(fig, path)


def draw_ap_by_size(metrics: dict[str, float], path) -> None:
    sizes = ("small", "medium", "large")
    values = [metrics.get(f"AP_{s}", -1.0) for s in sizes]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    bars = ax.bar(sizes, [max(v, 0.0) for v in values], color="#1f77b4")
    for bar, value in zip(bars, values):
        ax.annotate("no boxes" if value < 0 else f"{value:.3f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set(ylabel="AP@[.5:.95]", ylim=(0, 1.05),
           title="AP by object size (small < 32², medium < 96² px)")
    _save(fig, path)


def worst_images(errors: list[ImageErrors], count: int) -> list[ImageErrors]:
    """The images with the most missed plus false boxes (ties: the lower image id), only
    those with at least one error."""
    ranked = sorted((e for e in errors if e.missed + e.false), key=lambda e: (-(e.missed + e.false), e.image_id))
    return ranked[:count]


def caption(truth: ImageTruth, item: ImageErrors) -> str:
    """A gallery image's title: its file id (the image number when the id is unknown) and errors."""
    return f"{truth.name or f'image {item.image_id}'}: {item.missed} missed, {item.false} false"


def _short(text: str, limit: int = 44) -> str:
    """A title short enough for a small picture (the end kept: it tells ids apart)."""
    return text if len(text) <= limit else "…" + text[-(limit - 1):]


def draw_gallery(images: list[bytes], truths, detections, names: dict[int, str], threshold: float,
                 picked: list[ImageErrors], path) -> None:
    """A grid of the picked images (encoded bytes in image-id order), boxes drawn on them."""
    from PIL import Image

    columns = min(4, max(1, len(picked)))
    rows = max(1, math.ceil(len(picked) / columns))
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 3.2 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    by_id = {t.image_id: (t, d) for t, d in zip(truths, detections)}
    for ax, item in zip(axes.flat, picked):
        truth, found = by_id[item.image_id]
        image = Image.open(io.BytesIO(images[item.image_id - 1])).convert("RGB")
        width, height = image.size
        ax.imshow(image)
        for boxes, labels, colour, scores in ((truth.boxes, truth.labels, TRUTH_COLOUR, None),
                                              (found.boxes, found.labels, PREDICTION_COLOUR, found.scores)):
            for n, (box, label) in enumerate(zip(boxes, labels)):
                if scores is not None and scores[n] < threshold:
                    continue
                ymin, xmin, ymax, xmax = box
                ax.add_patch(plt.Rectangle((xmin * width, ymin * height), (xmax - xmin) * width,
                                           (ymax - ymin) * height, fill=False, edgecolor=colour, linewidth=1.5))
                text = names.get(label, str(label)) + ("" if scores is None else f" {scores[n]:.2f}")
                ax.text(xmin * width, ymin * height, text, color="white", fontsize=6, va="bottom",
                        bbox={"facecolor": colour, "pad": 1, "linewidth": 0})
        ax.set_title(_short(caption(truth, item)), fontsize=8)
    if not picked:
        axes.flat[0].text(0.5, 0.5, "no errors at this threshold", ha="center", va="center")
    fig.suptitle(f"Worst val images (truth green, predictions orange at score >= {threshold:.2f})", fontsize=10)
    _save(fig, path, dpi=80)


def draw_evaluation(out, truths, detections, names: dict[int, str], metrics: dict[str, float], threshold: float,
                    images: list[bytes] | None, gallery_size: int = 16) -> tuple[dict[str, str], list[str]]:
    """Every picture into folder `out`; returns {title: file name} for the report, and the
    gallery's captions in order (file id and errors of each worst image)."""
    draw_pr_curves(truths, detections, names, out / PR_FILE)
    draw_f1_threshold(truths, detections, threshold, out / F1_FILE)
    matrix, errors = confusion(truths, detections, names, threshold)
    draw_confusion(matrix, names, threshold, out / CONFUSION_FILE)
    write_confusion(matrix, names, threshold, out / CONFUSION_DATA_FILE)
    draw_ap_by_size(metrics, out / SIZE_FILE)
    files = {"Precision-recall per class": PR_FILE, "F1 against the score threshold": F1_FILE,
             "Confusion matrix": CONFUSION_FILE, "AP by object size": SIZE_FILE}
    captions = []
    if images is not None:
        picked = worst_images(errors, gallery_size)
        draw_gallery(images, truths, detections, names, threshold, picked, out / GALLERY_FILE)
        files["Worst val images"] = GALLERY_FILE
        by_id = {t.image_id: t for t in truths}
        captions = [caption(by_id[item.image_id], item) for item in picked]
    return files, captions
