"""`detpipe export --format`'s converted files, written together from one load of the model, with
label_map.json beside them (the class names `predict --model FILE` reads)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from beam.contract.label_map import write_label_map
from components.export.export_files import LABEL_MAP_FILE
from components.export.file_formats import CALIBRATION_IMAGES, FORMATS, ExportSettings, decoder_path


def convert_files(model_dir: str, kinds: list[str], output_dir: str, data_dir: str | None = None,
                  calibration_images: int = CALIBRATION_IMAGES) -> tuple[dict[str, str], dict[str, str]]:
    """Each kind's file in `output_dir`: (kind → path, kind → why its conversion failed): one
    format's converter failing leaves the others standing. `data_dir`: the shards whose train
    images calibrate an INT8 file."""
    from components.export.calibration import calibration_images as calibration
    from components.export.file_graph import load_graph
    from components.export.onnx_file import convert_onnx
    from components.export.tflite_file import convert_tflite

    unknown = [kind for kind in kinds if kind not in FORMATS]
    if unknown:
        raise ValueError(f"kind must be one of {', '.join(FORMATS)}, got {', '.join(map(repr, unknown))}")
    try:
        graph = load_graph(model_dir)
    except NotImplementedError as err:  # a tiled model: no file can answer as it does
        return {}, {kind: f"not built: {err}" for kind in kinds}
    sample = None
    if any(FORMATS[kind].int8 for kind in kinds):
        if not data_dir:
            raise ValueError("an INT8 file is calibrated on train images: give the shards")
        sample = calibration(data_dir, graph.image_size, calibration_images)
    os.makedirs(output_dir, exist_ok=True)
    _label_map_beside(graph.label_map, output_dir)
    files, errors = {}, {}
    with tempfile.TemporaryDirectory(prefix="detpipe-convert-") as saved_model:
        if any(FORMATS[kind].suffix == FORMATS["tflite"].suffix for kind in kinds):
            graph.write_saved_model(saved_model)
        for kind in kinds:
            path = os.path.join(output_dir, FORMATS[kind].file_name)
            try:
                convert_onnx(graph, path) if kind == "onnx" else convert_tflite(saved_model, kind, path, sample)
            except Exception as err:  # noqa: BLE001 - a converter's own error, reported for its format only
                first = (str(err).strip().splitlines() or [""])[0][:300]
                errors[kind] = f"{type(err).__name__}: {first}"
                continue
            files[kind] = path
    return files, errors


def _label_map_beside(label_map: dict[str, int], output_dir: str) -> None:
    path = Path(output_dir) / LABEL_MAP_FILE
    if not path.is_file():  # the SavedModel's export writes the same
        write_label_map(label_map, path)


def export_files(model_dir: str, kinds: list[str], output_dir: str, data_dir: str,
                 settings: ExportSettings = ExportSettings()) -> tuple[list, dict[str, str]]:
    """Convert, re-score each file on `data_dir`'s val split (rescore.py: export_report.md and
    export_formats.json in `output_dir`), and remove each file that failed, so what stays in
    `output_dir` (and goes to the registry with it) is what passed. (scores, conversion errors).
    `settings`: the calibration images and the tolerances (its formats are `kinds`)."""
    from components.export.rescore import rescore, write_report

    files, errors = convert_files(model_dir, kinds, output_dir, data_dir, settings.calibration_images)
    if not files:  # nothing to re-score (every conversion failed): the report says why
        os.makedirs(output_dir, exist_ok=True)
        write_report({}, [], output_dir, errors)
        return [], errors
    _, scores = rescore(model_dir, data_dir, files, settings.max_map_loss, settings.max_int8_map_loss, output_dir,
                        errors)
    for score in scores:
        if not score.passed:
            for path in [score.file] + ([decoder_path(score.file)] if FORMATS[score.kind].int8 else []):
                if os.path.exists(path):
                    os.remove(path)
    return scores, errors
