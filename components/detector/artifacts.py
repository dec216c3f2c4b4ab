"""The names of what `detpipe train` writes into its output folder, in one place: readers
(evaluation, export, the run report) import these instead of the whole trainer; and
`load_trained`, the one way to load a trained model with the config it was trained with."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from beam.contract.train_keys import TRAIN_KEYS_FILE
from components.detector.tile_choice import Tiling, model_tiling

MODEL_FILE = "model.keras"
CONFIG_FILE = "train_config.json"  # model config, label map, training options and result
HISTORY_FILE = "history.json"
REPORT_FILE = "train_report.md"
LOSS_CURVE_FILE = "loss_curve.png"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINT_DIR = "checkpoints"
# What another run needs to start from this one's weights (`detpipe train --init-from`, the
# pipeline's warm start); the registry keeps them with each version.
WARM_START_FILES = (MODEL_FILE, CONFIG_FILE)
# Kept with them when the run has it (its data had one): the train images it saw, from which a
# warm start tells how much of its own train split is new (beam/contract/train_keys.py).
WARM_START_EXTRAS = (TRAIN_KEYS_FILE,)


@dataclass(frozen=True)
class HistoryFile:
    """`history.json`: the run's learning curve, one row a chunk (an epoch unless
    `checkpoint_every` says otherwise) held as columns (`step`, `epoch`, `learning_rate`, the
    loss parts, `held_out_mAP`: None where not scored), and why training stopped. Written by
    the trainer, read by the run report.

    >>> h = HistoryFile.from_rows([{"step": 5, "loss": 2.0, "held_out_mAP": None},
    ...                            {"step": 10, "loss": 1.5, "held_out_mAP": 0.2}], stop="budget", best_step=10)
    >>> HistoryFile.from_dict(h.to_dict()) == h, h.columns["held_out_mAP"], h.scored()
    (True, [None, 0.2], [(10, 0.2)])
    """

    columns: dict[str, list]
    stop: str = ""  # why training ended (curve.py's reasons)
    best_step: int = 0  # the step whose weights were kept; 0: the last step's
    score_seconds: float = 0.0  # spent scoring the held-out images

    @classmethod
    def from_rows(cls, rows: list[dict], **stopped) -> "HistoryFile":
        names = list(dict.fromkeys(name for row in rows for name in row))
        return cls({name: [row.get(name) for row in rows] for name in names}, **stopped)

    def to_dict(self) -> dict:
        if not self.columns:
            return {}
        return {**self.columns, "stopped": {"reason": self.stop, "best_step": self.best_step,
                                            "score_seconds": self.score_seconds}}

    @classmethod
    def from_dict(cls, data: dict) -> "HistoryFile":
        stopped = data.get("stopped") or {}
        return cls({k: v for k, v in data.items() if k != "stopped"}, stopped.get("reason", ""),
                   stopped.get("best_step", 0), stopped.get("score_seconds", 0.0))

    def write(self, folder: Path) -> None:
        (Path(folder) / HISTORY_FILE).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def read(cls, folder: str | Path) -> "HistoryFile":
        """The folder's history.json; an empty one when there is none (a model trained before it)."""
        path = Path(folder) / HISTORY_FILE
        return cls.from_dict(json.loads(path.read_text())) if path.is_file() else cls({})

    def scored(self) -> list[tuple[int, float]]:
        """(step, held-out mAP) of every scored row."""
        return [(s, v) for s, v in zip(self.columns.get("step", []), self.columns.get("held_out_mAP", []))
                if v is not None]


@dataclass(frozen=True)
class TrainConfigFile:
    """`train_config.json`: what evaluation, export, tuning, the run report and the local
    run's summary need of a training run. One definition for the trainer that writes it
    and every reader: a missing field fails `from_dict` at once, naming the file.

    >>> record = TrainConfigFile({"image_size": 96, "max_detections": 100}, {}, {"images_per_second": 5.0},
    ...                          {"cat": 1})
    >>> TrainConfigFile.from_dict(record.to_dict()) == record, record.image_size
    (True, 96)
    """

    model: dict  # ModelConfig.to_dict(): what rebuilds and serves the model (image_size, max_detections, ...)
    train: dict  # the TrainConfig the run used
    result: dict  # TrainResult.to_dict(): steps, batch, images/s, decisions, shape, ...
    label_map: dict[str, int]

    @property
    def image_size(self) -> int:
        return self.model["image_size"]

    @property
    def max_detections(self) -> int:
        return self.model["max_detections"]

    @property
    def tiling(self) -> Tiling | None:
        """How the model sees photos: tile_choice.Tiling, or None for whole photos (also for a
        model trained before tiles existed)."""
        return model_tiling(self.image_size, self.model.get("tiled", False), self.model.get("tile_overlap", 0))

    @property
    def images_per_second(self) -> float:
        return self.result["images_per_second"]

    @property
    def warm_start(self) -> dict:
        """WarmStart.to_dict() (components/train/warm_start.py): {"used", "name", "reason",
        "line", ...}; a run recorded before warm starts reads as from scratch."""
        return self.result.get("warm_start") or {"used": False, "name": "", "reason": "",
                                                 "line": "from scratch", "new_classes": []}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfigFile":
        missing = [f.name for f in fields(cls) if f.name not in data]
        if missing:
            raise ValueError(f"{CONFIG_FILE} has no {', '.join(missing)}: written by another detpipe? "
                             "train again")
        record = cls(**{f.name: data[f.name] for f in fields(cls)})
        for key in ("image_size", "max_detections"):
            if key not in record.model:
                raise ValueError(f"{CONFIG_FILE} has no model.{key}: written by another detpipe? train again")
        return record

    def write(self, folder: str | Path) -> None:
        (Path(folder) / CONFIG_FILE).write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")

    @classmethod
    def read(cls, folder: str | Path) -> "TrainConfigFile":
        return cls.from_dict(json.loads((Path(folder) / CONFIG_FILE).read_text()))


def _float32_config(node):
    """A model.keras config with every mixed precision policy (a layer's `dtype`) made float32.
    The variables of a mixed policy are float32 already; only what the layers compute in changes."""
    from components.detector.precision import is_mixed

    if isinstance(node, list):
        return [_float32_config(value) for value in node]
    if not isinstance(node, dict):
        return node
    if node.get("class_name") == "DTypePolicy" and is_mixed(node.get("config", {}).get("name", "")):
        return {**node, "config": {**node["config"], "name": "float32"}}
    return {key: ("float32" if key == "dtype" and isinstance(value, str) and is_mixed(value) else
                  _float32_config(value)) for key, value in node.items()}


def _float32_copy(path: Path, folder: str) -> Path:
    """model.keras rewritten by `_float32_config` into `folder` (the archive's other entries as they are)."""
    import zipfile

    copy = Path(folder) / MODEL_FILE
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(copy, "w") as target:
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename == "config.json":
                data = json.dumps(_float32_config(json.loads(data))).encode()
            target.writestr(item, data)
    return copy


def load_trained(model_dir: str, float32: bool = False):
    """The trained model (for inference: no optimizer or losses) and its `TrainConfigFile`;
    with `float32`, computing in float32 whatever precision policy it trained under (a file
    converted for a runtime without float16 kernels, e.g. TFLite's builtin ops).
    Keras is imported here, not at the top: the run report reads this module's names only."""
    import keras

    # Registers detpipe's model classes, and through keras_hub KerasHub's, for load_model.
    from components.detector import nms, retinanet  # noqa: F401

    model_dir_path = Path(model_dir)
    path = model_dir_path / MODEL_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {model_dir} the output of `detpipe train`?")
    if not (model_dir_path / CONFIG_FILE).exists():
        raise FileNotFoundError(f"{model_dir} has {MODEL_FILE} but no {CONFIG_FILE} (the label map and input size "
                                "training used): pass the whole output folder of `detpipe train`")
    config = TrainConfigFile.read(model_dir_path)
    if float32:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="detpipe-float32-") as folder:
            return keras.saving.load_model(_float32_copy(path, folder), compile=False), config
    return keras.saving.load_model(path, compile=False), config
