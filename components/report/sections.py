"""What each section of the run report shows, read from a run's artifacts.

Each function takes a step's output (a folder or a JSON file, local paths) and returns
plain data for the template; pictures come back as PNG bytes encoded as data: URIs, so the
page needs nothing from the network.
"""

from __future__ import annotations

import base64
import io
import json
from collections import defaultdict
from pathlib import Path

import matplotlib

from beam.contract.files import read_manifest, read_rejects
from beam.contract import feature_keys as K
from beam.contract.manifest import MANIFEST_FILE, near_duplicate_line, stats_file_name
from beam.contract.rejects import Reject
from components.detector.artifacts import CONFIG_FILE, LOSS_CURVE_FILE, TrainConfigFile
from components.evaluate.metrics_file import METRICS_FILE, EvalMetrics
from components.model_registry.decision import DecisionRecord, comparison_line

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

REJECT_EXAMPLES = 5
_CLASS_TEXT = K.CLASS_TEXT
_BOX_SIZES = (K.BOX_WIDTH, K.BOX_HEIGHT)


def png_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def file_uri(path: Path) -> str | None:
    return png_uri(path.read_bytes()) if path.is_file() else None


def _figure_uri(fig) -> str:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return png_uri(buffer.getvalue())


def _read_json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def _train_statistics(dataset_dir: Path):
    from tensorflow_metadata.proto.v0 import statistics_pb2

    path = dataset_dir / stats_file_name("train")
    if not path.is_file():
        return None
    stats = statistics_pb2.DatasetFeatureStatisticsList()
    stats.ParseFromString(path.read_bytes())
    return {"/".join(f.path.step) or f.name: f for f in stats.datasets[0].features} if stats.datasets else None


def _class_histogram(features) -> str | None:
    feature = features.get(_CLASS_TEXT) if features else None
    if feature is None or not feature.string_stats.top_values:
        return None
    pairs = sorted(((v.value, v.frequency) for v in feature.string_stats.top_values), key=lambda p: -p[1])
    # At least room for the title, the axis and one bar: with one class (raccoon) a height from
    # the bar count alone left the bar no pixels.
    fig, ax = plt.subplots(figsize=(6, max(1.8, 0.8 + 0.35 * len(pairs))))
    ax.barh([p[0] for p in pairs][::-1], [p[1] for p in pairs][::-1], color="#1f77b4")
    ax.set(xlabel="boxes in the train split", title="Boxes per class (train)")
    return _figure_uri(fig)


def _box_size_histogram(features) -> str | None:
    if not features or not all(k in features for k in _BOX_SIZES):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    for ax, key in zip(axes, _BOX_SIZES):
        standard = [h for h in features[key].num_stats.histograms if h.type == 0]
        if standard:
            buckets = standard[0].buckets
            ax.bar([b.low_value for b in buckets], [b.sample_count for b in buckets],
                   width=[b.high_value - b.low_value for b in buckets], align="edge", color="#ff7f0e",
                   edgecolor="white")
        ax.set(xlabel=f"{key.split('_')[-1]} (share of the image)", ylabel="boxes",
               title=f"Box {key.split('_')[-1]}s (train)")
    return _figure_uri(fig)


def dataset_section(dataset_dir: str | Path) -> dict | None:
    """Counts, rejected images and dropped boxes by reason with examples, class and box-size
    histograms, anomalies. Reads `manifest.json` and the `rejects-*.jsonl` files through their one
    definition (beam/contract/manifest.py, beam/source_records.py)."""
    folder = Path(dataset_dir)
    if not (folder / MANIFEST_FILE).is_file():
        return None
    manifest = read_manifest(str(folder))
    examples: dict[tuple[bool, str], list[Reject]] = defaultdict(list)
    for reject in read_rejects(str(folder)):
        shown = examples[(reject.is_box, reject.reason)]
        if len(shown) < REJECT_EXAMPLES:
            shown.append(reject)
    features = _train_statistics(folder)
    return {
        "manifest": manifest,
        "rejects": [{"reason": reason, "count": count, "examples": examples.get((False, reason), [])}
                    for reason, count in manifest.rejected_by_reason.items()],
        "box_rejects": [{"reason": reason, "count": count, "examples": examples.get((True, reason), [])}
                        for reason, count in manifest.boxes_rejected_by_reason.items()],
        "boxes": manifest.boxes,
        "class_histogram": _class_histogram(features),
        "box_sizes": _box_size_histogram(features),
        "anomalies": manifest.anomalies,
        "anomalies_allowed": manifest.anomalies_allowed,
        "class_names": sorted({name for counts in manifest.class_boxes.values() for name in counts}),
        "near_duplicates": near_duplicate_line(manifest),
    }


def probe_section(probe_json: str | Path) -> dict | None:
    probe = _read_json(Path(probe_json))
    if probe is None:
        return None
    return {"verdict": probe["verdict"], "checks": probe["checks"],
            "recommendations": probe.get("recommendations", {})}


def training_section(train_dir: str | Path) -> dict | None:
    folder = Path(train_dir)
    if not (folder / CONFIG_FILE).is_file():
        return None
    config = TrainConfigFile.read(folder)
    return {"result": config.result, "decisions": config.result["decisions"], "model": config.model,
            "warm_start": config.warm_start["line"],
            "loss_curve": file_uri(folder / LOSS_CURVE_FILE)}


def tuning_section(tune_dir: str | Path) -> dict | None:
    """What the tune step decided and found: its one-line decision, the trials, the winner and
    the defaults on the tuning split, the cost, and its pictures."""
    from components.tune.hparams_file import BEST_FILE, BestHparams
    from components.tune.trials import read_trials
    from components.tune.tune_report import HISTORY_PICTURE, IMPORTANCE_PICTURE

    folder = Path(tune_dir)
    data = _read_json(folder / BEST_FILE)
    if data is None:
        return None
    best = BestHparams.from_dict(data)
    trials = [{"number": t.number, "state": t.state, "hparams": t.hparams, "error": t.error,
               "rungs": t.rungs_line() or _fmt_score(t.score)} for t in read_trials(str(folder))]
    search = best.search
    pictures = [{"title": title, "uri": file_uri(folder / name)} for name, title in
                ((HISTORY_PICTURE, "Optimisation history"), (IMPORTANCE_PICTURE, "Hyperparameter importance"))
                if (folder / name).is_file()]
    return {"decision": best.decision, "hparams": best.hparams, "trials": trials, "names": list(best.hparams),
            "score": best.score if best.score is not None else -1.0,
            "defaults_score": best.defaults_score if best.defaults_score is not None else -1.0,
            "gain": "n/a" if best.gain is None else f"{best.gain:+.3f}", "best_trial": search.get("best_trial"),
            "split": search.get("tuning_split", {}), "regime": search.get("regime", ""),
            "cost": (f"{search['steps_trained']} steps, {search['cost']:g}x the training's; {search['seconds']:.0f} s"
                     if "cost" in search else ""),
            "pictures": pictures}


def _fmt_score(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def evaluation_section(evaluation_dir: str | Path) -> dict | None:
    from components.evaluate.pictures import CONFUSION_FILE, F1_FILE, GALLERY_FILE, PR_FILE, SIZE_FILE

    folder = Path(evaluation_dir)
    if not (folder / METRICS_FILE).is_file():
        return None
    metrics = EvalMetrics.read(folder / METRICS_FILE)
    titles = {PR_FILE: "Precision-recall per class", F1_FILE: "F1 against the score threshold",
              CONFUSION_FILE: "Confusion matrix", SIZE_FILE: "AP by object size", GALLERY_FILE: "Worst val images"}
    pictures = [{"title": title, "uri": file_uri(folder / name)} for name, title in titles.items()
                if (folder / name).is_file()]
    return {"summary": metrics.summary, "per_class": metrics.per_class, "per_class_ap50": metrics.per_class_ap50,
            "num_images": metrics.num_images, "threshold": metrics.threshold, "pictures": pictures,
            "cap_warning": metrics.cap.warning(metrics.num_images) if metrics.cap else None,
            "prediction": metrics.prediction.line() if metrics.prediction else None}


REVIEW_ROWS = 10  # the label issues listed in the report; the review's page has every flagged one


def review_section(review_dir: str | Path) -> dict | None:
    """The label review's summary line, its counts by kind and the issues most likely wrong."""
    from components.review.label_review import KINDS, REVIEW_FILE, ReviewSummary, read_review, summary_sentence

    path = Path(review_dir) / REVIEW_FILE
    if not path.is_file():
        return None
    issues = read_review(path)
    concluded = ReviewSummary.read(review_dir)  # says why nothing is flagged when the model was too weak
    return {"summary": concluded.sentence if concluded else summary_sentence(issues), "flagged": len(issues),
            "rows": issues[:REVIEW_ROWS],
            "kinds": {kind: sum(i.kind == kind for i in issues) for kind in KINDS}}


def files_section(export_dir: str | Path) -> dict | None:
    """The export step's converted files, each re-scored (export_formats.json); None when none."""
    from components.export.rescore import read_formats

    written = read_formats(str(export_dir))
    if written is None:
        return None
    base, scores, errors = written
    return {"base": base, "scores": scores, "errors": errors}


def comparison_section(decision_json: str | Path) -> dict | None:
    if not Path(decision_json).is_file():
        return None
    decision = DecisionRecord.read(decision_json)
    return {"line": comparison_line(decision), "decision": decision}
